"""What the two TensorRT-LLM runtimes share: a GPU, CUDA, FP16/BF16, a container image that ships the spec's
TensorRT-LLM version (trtllm_versions.py), the memory plan `trtspec check` prints, and a server that is the
Triton TensorRT-LLM container's own (trtspec.serve.container), run in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.backends import trtllm_versions as versions
from trtspec.backends.base import Backend, Capabilities
from trtspec.errors import PairError
from trtspec.spec import Problem, Spec

# TensorRT-LLM's speculative-decoding support matrices (NVIDIA/TensorRT-LLM examples/eagle, examples/lookahead and
# examples/medusa READMEs, "Support Matrix") list FP16, BF16 (and FP8), never FP32.
DTYPES = ("float16", "bfloat16")


class TrtllmBackend(Backend):
    capabilities = Capabilities(devices=("cuda",), gpu=True, max_world_size=None, dtypes=DTYPES)
    custom_versions = False  # a TensorRT-LLM version no NGC container ships, in a custom image (LLM API only)

    def dtype(self, spec: Spec) -> tuple[str, str]:
        if spec.runtime.trtllm.dtype is not None:
            return "runtime.trtllm.dtype", spec.runtime.trtllm.dtype
        return "model.dtype", spec.model.dtype

    def problems(self, spec: Spec) -> list[Problem]:
        """The shared rules, the dtype said as TensorRT-LLM's support matrix says it, and the image/version pair
        against the container table."""
        key, dtype = self.dtype(spec)
        p = [q for q in super().problems(spec) if q.key != key]
        if dtype not in DTYPES:
            keep = ", or runtime.trtllm.dtype = \"float16\" to keep model.dtype for the torch runtime" \
                if key == "model.dtype" else ""
            p.append(Problem(key, dtype, f"runtime '{self.name}' does not serve it: TensorRT-LLM's speculative "
                             "decoding supports FP16/BF16/FP8 only", f"set {key} = \"float16\"{keep}"))
        t = spec.runtime.trtllm
        for k, message, hint in versions.image_problems(t.version, t.image, custom_versions=self.custom_versions):
            p.append(Problem(k, getattr(t, k.rpartition(".")[2]), message, hint))
        return p

    def check(self, spec: Spec, report: Any, *, models: bool, engines: Path | None,
              server_version: str | None) -> None:
        """The image it cannot check by name, then the GPU memory plan (weights + KV cache per model) once the
        pair is known."""
        if (note := versions.image_note(spec.runtime.trtllm.version, spec.runtime.trtllm.image)) is not None:
            report.notes.append(note)
        if models and report.pair is not None:
            from trtspec.backends.trtllm_engine_methods import engine_method
            from trtspec.builders.trtllm.memory import memory_plan

            plan = memory_plan(spec, engine_method(spec))  # (the LLM API sizes its models as the engines would)
            if plan.ok:
                report.memory_plan = "\n".join(plan.lines())
            report.add(PairError, [f"memory plan: {p}" for p in plan.problems])

    def emit_files(self, spec: Spec, files: dict[str, str], repo_dir: Path) -> Path:
        from trtspec.builders.trtllm_build import emit_repository

        emit_repository(spec, files, Path(repo_dir))
        return Path(repo_dir)

    def server(self, spec, options):
        from trtspec.serve.container import ContainerServer

        repo = Path(options.out_repo) / spec.name
        ports = {"http_port": options.http_port or None, "grpc_port": options.grpc_port or None,
                 "metrics_port": options.metrics_port or None}  # 0 (free) is the bundled server's; here: the spec's
        return ContainerServer(spec, self.name, repo,
                               lambda key: self.launch_command(spec, repo, host=options.host, admin_key=key, **ports),
                               admin_key=options.admin_key, open_model_control=options.open_model_control)
