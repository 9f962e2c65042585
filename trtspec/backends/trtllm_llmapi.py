"""Runtime `trtllm-llmapi`: no engine build; a Triton `llmapi` model whose model.yaml carries the LLM API's
speculative_config (builders/llmapi_build.py, repository/trtllm/llmapi.py; each method's comes from the runtime's
method table, trtllm_llmapi_methods.py), loading the HF checkpoints itself; served by the TRT-LLM container's
tritonserver under `mpirun -n 1`, as upstream's launch_triton_server.py runs it (the LLM API spawns its TP x PP
workers from that MPI world)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.backends.trtllm import TrtllmBackend
from trtspec.spec import Problem, Spec


class TrtllmLlmapiBackend(TrtllmBackend):
    name = "trtllm-llmapi"
    custom_versions = True  # no engines to deserialize: a newer TensorRT-LLM installed into a custom image

    def method_problems(self, spec: Spec) -> list[Problem]:
        from trtspec.backends.trtllm_llmapi_methods import llmapi_method

        return llmapi_method(spec).problems(spec)

    def notes(self, spec: Spec) -> list[str]:
        from trtspec.backends.trtllm_llmapi_methods import llmapi_method

        return llmapi_method(spec).notes(spec)

    def check(self, spec: Spec, report: Any, *, models: bool, engines: Path | None,
              server_version: str | None) -> None:
        """The shared checks, then model.yaml's arguments as build writes them, once the models are checked: what
        the drafter asks of the TensorRT-LLM version (an EAGLE-3 head's captured layers) is a problem here."""
        super().check(spec, report, models=models, engines=engines, server_version=server_version)
        if models and report.pair is not None:
            from trtspec.backends.trtllm_llmapi_methods import llm_args
            from trtspec.errors import PairError, RepositoryError

            try:
                llm_args(spec)
            except RepositoryError as exc:
                report.add(PairError, [f"{exc.message} (fix: {exc.hint})" if exc.hint else exc.message], exc.hint)

    def build(self, spec, options):
        from trtspec import methods
        from trtspec.backends.trtllm_llmapi_methods import llm_args
        from trtspec.builders import llmapi_build

        return llmapi_build.build(spec, options, runtime=self.name, method=methods.get(spec.method),
                                  method_args=llm_args(spec))

    def emit_repository(self, spec: Spec, repo_dir: Path, engine_dir: Path) -> Path:
        from trtspec.backends.trtllm_llmapi_methods import llm_args
        from trtspec.repository.trtllm.llmapi import render_llmapi_repository

        return self.emit_files(spec, render_llmapi_repository(spec, llm_args(spec), Path(repo_dir)), repo_dir)

    def bundle_payload(self, spec, out, manifest, repo_dst, img, engines_root):
        from trtspec.backends.bundle import checkpoint_payload

        return checkpoint_payload(spec, out, manifest, repo_dst, img, engines_root)

    def launch_command(self, spec: Spec, repo_dir: str | Path, **kwargs: Any) -> list[str]:
        from trtspec.repository.trtllm.launch import llmapi_command

        return llmapi_command(spec, repo_dir, **kwargs)
