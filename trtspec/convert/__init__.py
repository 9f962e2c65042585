"""`trtspec convert`: native HF -> TensorRT-LLM checkpoint writer (pure torch + safetensors, CPU).

    result = convert(spec, out_dir=None, tp=None, pp=None, force=False)

writes one checkpoint per role the spec's method needs (its module's `convert_jobs`, trtspec/methods/)
into `<out_dir>/<role>/` (default `<engines>/<name>/checkpoints/<role>/`):

    method        target checkpoint                     draft checkpoint
    draft-model   LlamaForCausalLM                       LlamaForCausalLM (same TP, PP 1)
    medusa        MedusaForCausalLM (base + heads)       -
    eagle         EagleForCausalLM (base + EAGLE-1 head) -
    lookahead     LlamaForCausalLM                       -
    none          LlamaForCausalLM                       -

`read_checkpoint(dir)` reassembles the HF state dicts from any sharding (the proof of the
writer: round trips are bit-identical). Unsupported architectures raise ConvertError listing
the supported ones (`SUPPORTED_ARCHITECTURES`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from trtspec.convert.checkpoint import (MANIFEST, ConvertedCheckpoint, ConvertJob, Reassembled,
                                        hf_config_from_trtllm, is_fresh, read_checkpoint, read_manifest, run_job)
from trtspec.convert.hf import SUPPORTED_ARCHITECTURES, TRTLLM_ARCHITECTURES
from trtspec.errors import ConvertError
from trtspec.spec import Spec

DEFAULT_ENGINES = Path("engines")


@dataclasses.dataclass
class ConvertResult:
    out_dir: str
    checkpoints: dict[str, ConvertedCheckpoint]
    seconds: float

    @property
    def converted(self) -> list[str]:
        return [r for r, c in self.checkpoints.items() if c.converted]

    def to_dict(self) -> dict[str, Any]:
        return {"out_dir": self.out_dir, "seconds": round(self.seconds, 3),
                "checkpoints": {r: c.to_dict() for r, c in self.checkpoints.items()},
                "converted": self.converted}


def default_out_dir(spec: Spec, engines: Path = DEFAULT_ENGINES) -> Path:
    return Path(engines) / spec.name / "checkpoints"


def jobs_for_spec(spec: Spec, out_dir: Path | None = None, *, tp: int | None = None, pp: int | None = None,
                  engines: Path = DEFAULT_ENGINES) -> list[ConvertJob]:
    """The conversions a spec needs (reads only small config files): its method's (trtspec/methods/<name>.py),
    after the method's engine rules (`pp` may be the CLI's)."""
    from trtspec import methods

    out = Path(out_dir) if out_dir is not None else default_out_dir(spec, engines)
    tp = tp or spec.gpu.tensor_parallel
    pp = pp or spec.gpu.pipeline_parallel
    method = methods.get(spec.method)
    methods.raise_first(method.engine_problems(spec, pp=pp), ConvertError)
    return method.convert_jobs(spec, out, tp, pp)


def convert(spec: Spec, out_dir: Path | None = None, *, tp: int | None = None, pp: int | None = None,
            force: bool = False, engines: Path = DEFAULT_ENGINES,
            log: Callable[[str], None] | None = None) -> ConvertResult:
    """Write (or confirm up to date) every checkpoint the spec needs. Atomic per checkpoint."""
    t0 = time.perf_counter()
    jobs = jobs_for_spec(spec, out_dir, tp=tp, pp=pp, engines=engines)
    done = {job.role: run_job(job, force=force, log=log) for job in jobs}
    out = Path(out_dir) if out_dir is not None else default_out_dir(spec, engines)
    return ConvertResult(str(out), done, time.perf_counter() - t0)


__all__ = ["ConvertJob", "ConvertResult", "ConvertedCheckpoint", "MANIFEST", "Reassembled", "SUPPORTED_ARCHITECTURES",
           "TRTLLM_ARCHITECTURES", "convert", "default_out_dir", "hf_config_from_trtllm", "is_fresh", "jobs_for_spec",
           "read_checkpoint", "read_manifest", "run_job"]
