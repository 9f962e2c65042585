"""Runtime `torch`: trtspec's own PyTorch speculative engine (trtspec.runtime), served by Triton's Python
backend; on CPU or one CUDA device. Builds copy the weights in the serving dtype (builders/torch_build.py);
it serves on the bundled Triton server (trtspec.serve.bundled) and deploys onto a running one
(trtspec.serve.deploy)."""

from __future__ import annotations

from pathlib import Path

from trtspec.backends.base import Backend, Capabilities
from trtspec.spec import Problem, Spec


class TorchBackend(Backend):
    name = "torch"
    capabilities = Capabilities(devices=("cpu", "cuda"), gpu=False, max_world_size=1, deploy=True)

    def world_size_problem(self, spec: Spec) -> Problem:
        return Problem("gpu.tensor_parallel", spec.gpu.tensor_parallel, "the torch runtime runs on one device",
                       "set tensor_parallel = pipeline_parallel = 1, or use a trtllm runtime")

    def build(self, spec, options):
        from trtspec import methods
        from trtspec.builders import torch_build

        return torch_build.build(spec, options, runtime=self.name, method=methods.get(spec.method))

    def emit_repository(self, spec: Spec, repo_dir: Path, engine_dir: Path) -> Path:
        from trtspec.artifacts.fs import atomic_dir
        from trtspec.repository.torch_repo import emit_torch_repository

        with atomic_dir(Path(repo_dir)) as tmp:
            emit_torch_repository(spec, tmp, Path(engine_dir), final_root=Path(repo_dir))
        return Path(repo_dir)

    def server(self, spec, options):
        from trtspec.serve.bundled import BundledServer

        return BundledServer(spec, out_repo=options.out_repo, ready_timeout=options.ready_timeout,
                             grpc_port=options.grpc_port, http_port=options.http_port,
                             metrics_port=options.metrics_port, host=options.host, admin_key=options.admin_key,
                             open_model_control=options.open_model_control, drain_timeout=options.drain_timeout,
                             grpc_tls=options.grpc_tls)
