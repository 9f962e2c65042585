"""What the two TensorRT-LLM runtimes share: a GPU, CUDA, the memory plan `trtspec check` prints, and a
server that is the Triton TensorRT-LLM container's own (trtspec.serve.container), run in the foreground."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.backends.base import Backend, Capabilities
from trtspec.errors import PairError
from trtspec.spec import Spec


class TrtllmBackend(Backend):
    capabilities = Capabilities(devices=("cuda",), gpu=True, max_world_size=None)

    def check(self, spec: Spec, report: Any, *, models: bool, engines: Path | None,
              server_version: str | None) -> None:
        """The GPU memory plan (weights + KV cache per model) once the pair is known."""
        if models and report.pair is not None:
            from trtspec.builders.trtllm.memory import memory_plan

            plan = memory_plan(spec)
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
