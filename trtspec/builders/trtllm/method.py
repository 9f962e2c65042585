"""What the trtllm-engine runtime makes of a speculative method: the interface its build plan, memory plan,
converter jobs and repository ask, with the defaults of a method it does not map (refused: a spec problem,
never a half-built engine).

The rows, one per method the runtime maps, are the runtime's method table (trtspec/backends/
trtllm_engine_methods.py); the backend looks the spec's row up and passes it down, so nothing here or below
looks a method up by name.

    identity      name, title (as messages spell it); mapped: trtspec can build it as TensorRT-LLM engines
    rules         engine_problems(spec, pp): why the spec cannot become engines (spec validation asks too)
    engines       engine_roles, draft_engine; max_draft_len, extra_seq_len (what trtllm-build adds to the
                  target's max_seq_len)
    trtllm-build  speculative_decoding_mode, draft_len_flag, paged_context_fmha -> build_flags(spec, role)
    repository    decoding_mode, multi_block, fast_logits, backend_parameters (trtspec/repository/trtllm/engine.py)
    converter     convert_jobs: the checkpoints to write, with their head layout (trtspec/convert/trtllm_heads.py)
    memory        memory_extras: what the method's heads add to the target engine (memory.py)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from trtspec.convert.checkpoint import LLAMA, ConvertJob
from trtspec.errors import ConvertError
from trtspec.spec import Problem, Spec, raise_first

if TYPE_CHECKING:
    from trtspec.artifacts.hf import ModelConfig
    from trtspec.builders.trtllm.memory import HeadSizes

TARGET, DRAFT = "target", "draft"  # engine / checkpoint roles


class EngineMethod:
    mapped: ClassVar[bool] = False                 # trtspec can build it as TensorRT-LLM engines
    speculative_decoding_mode: ClassVar[str | None] = None
    draft_len_flag: ClassVar[bool] = False         # --max_draft_len on the target's trtllm-build line
    paged_context_fmha: ClassVar[bool] = False     # --use_paged_context_fmha enable (KV-cache reuse needs it)
    decoding_mode: ClassVar[str] = "top_k_top_p"
    multi_block: ClassVar[bool] = True             # TensorRT-LLM's runner turns multi-block mode off for some
    pipeline_parallel: ClassVar[bool] = True

    def __init__(self, name: str, title: str | None = None):
        self.name, self.title = name, title or name

    def __repr__(self) -> str:
        return f"<trtllm-engine method {self.name}>"

    # ------------------------------------------------------------------------------------------ rules

    def engine_problems(self, spec: Spec, pp: int | None = None) -> list[Problem]:
        """Why the spec cannot become TensorRT-LLM engines (spec alone, no file read): asked by the spec's
        validation for runtime trtllm-engine, and again by the converter (`pp`: its --pp) and the build plan."""
        if not self.mapped:
            return [Problem("speculative.method", self.name, "trtspec has no TensorRT-LLM engine build for it: "
                            "no trtllm-build flags, checkpoint layout or backend parameters",
                            "use runtime.kind = \"torch\"")]
        pp = spec.gpu.pipeline_parallel if pp is None else pp
        problem = self.pipeline_problem(pp)
        return [problem] if problem else []

    def pipeline_problem(self, pp: int) -> Problem | None:
        if pp > 1 and not self.pipeline_parallel:
            return Problem("gpu.pipeline_parallel", pp, f"{self.title} does not support pipeline parallelism",
                           "set pipeline_parallel = 1")
        return None

    # ------------------------------------------------------------------------------------------ engines

    def engine_roles(self, spec: Spec) -> tuple[str, ...]:
        """The TensorRT-LLM engines the deployment needs."""
        return (TARGET,)

    def draft_engine(self, spec: Spec) -> bool:
        """Two TensorRT-LLM models: the BLS drives speculation, Triton runs in orchestrator mode."""
        return DRAFT in self.engine_roles(spec)

    def max_draft_len(self, spec: Spec) -> int:
        """The target engine's max_draft_len (may read the method's checkpoint: ConvertError)."""
        return 0

    def extra_seq_len(self, spec: Spec) -> int:
        """What trtllm-build adds to the target's max_seq_len (TensorRT-LLM's build.py adds max_draft_len)."""
        return self.max_draft_len(spec)

    def build_flags(self, spec: Spec, role: str) -> list[str]:
        """The method's trtllm-build flags for one engine (after the plan's common ones)."""
        flags = ["--use_paged_context_fmha", "enable"] if self.paged_context_fmha else []
        if role == TARGET and self.speculative_decoding_mode:
            flags += ["--speculative_decoding_mode", self.speculative_decoding_mode]
            if self.draft_len_flag:
                flags += ["--max_draft_len", str(self.max_draft_len(spec))]
        return flags

    # ------------------------------------------------------------------------------------------ repository

    def fast_logits(self, spec: Spec) -> bool:
        """Draft logits go straight from the draft to the target executor (orchestrator mode)."""
        return False

    def backend_parameters(self, spec: Spec, role: str) -> dict[str, str]:
        """The method's parameters of tensorrt_llm/config.pbtxt (medusa_choices, lookahead_*, ...)."""
        return {}

    # ------------------------------------------------------------------------------------------ converter

    def conversions(self, spec: Spec, out: Path, tp: int | None = None, pp: int | None = None) -> list[ConvertJob]:
        """The checkpoints to convert for the spec into `out`/<role>/ (reads only small config files), after the
        engine rules (a refused method is a ConvertError); `tp`, `pp`: the CLI's, else the spec's."""
        tp = tp or spec.gpu.tensor_parallel
        pp = pp or spec.gpu.pipeline_parallel
        raise_first(self.engine_problems(spec, pp=pp), ConvertError)
        return self.convert_jobs(spec, Path(out), tp, pp)

    def convert_jobs(self, spec: Spec, out: Path, tp: int, pp: int) -> list[ConvertJob]:
        """The TensorRT-LLM checkpoints to write under `out`: by default the target as a plain Llama."""
        return [ConvertJob(TARGET, LLAMA, Path(spec.model.target), None, out / TARGET, tp, pp, spec.trtllm_dtype)]

    # ------------------------------------------------------------------------------------------ memory

    def memory_extras(self, spec: Spec, target: ModelConfig, tp: int, nbytes: int) -> HeadSizes | None:
        """What the method's heads add to the target engine (memory.py); None: nothing."""
        return None
