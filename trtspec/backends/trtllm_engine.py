"""Runtime `trtllm-engine`: HF -> TensorRT-LLM checkpoints (trtspec.convert), `trtllm-build` per engine
(builders/trtllm_build.py, out of process), the tensorrtllm-backend `inflight_batcher_llm` repository
(repository/trtllm/engine.py), served by the TRT-LLM container's tritonserver under mpirun.

Legacy: TensorRT-LLM main has no engines, trtllm-build or C++ Triton backend any more, so this runtime is pinned
to the TensorRT-LLM 1.2 containers (trtllm_versions.ENGINE_SERIES) and `trtspec check` says so.

How it builds and serves each method is its method table (trtllm_engine_methods.py): every hook here looks the
spec's row up (`engine_method`) and passes it down to the plan, the converter, the memory plan, the repository
and the launch command."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.backends import trtllm_versions as versions
from trtspec.backends.trtllm import TrtllmBackend
from trtspec.errors import BuildError
from trtspec.spec import Problem, Spec


class TrtllmEngineBackend(TrtllmBackend):
    name = "trtllm-engine"

    def problems(self, spec: Spec) -> list[Problem]:
        p = super().problems(spec)
        v = spec.runtime.trtllm.version
        if versions.series(v) != versions.ENGINE_SERIES and v in versions.known_versions():
            newest = [r for r in versions.RELEASES if versions.series(r.trtllm) == versions.ENGINE_SERIES][-1]
            p.append(Problem("runtime.trtllm.version", v, f"runtime 'trtllm-engine' is pinned to TensorRT-LLM "
                             f"{versions.ENGINE_SERIES}.x (a legacy runtime)",
                             f"set version = \"{newest.trtllm}\" and image = \"{newest.image}\", or runtime.kind = "
                             "\"trtllm-llmapi\""))
        return p

    def method_problems(self, spec: Spec) -> list[Problem]:
        from trtspec.backends.trtllm_engine_methods import engine_method

        return engine_method(spec).engine_problems(spec)

    def check(self, spec: Spec, report: Any, *, models: bool, engines: Path | None,
              server_version: str | None) -> None:
        """The legacy note, the memory plan, then built engines against the serving container's TensorRT-LLM
        version."""
        report.notes.append(versions.LEGACY_NOTE)
        super().check(spec, report, models=models, engines=engines, server_version=server_version)
        engine_dir = Path(engines) / spec.name if engines is not None else None
        if engine_dir is not None and engine_dir.is_dir():
            from trtspec.builders.trtllm.engine_cache import check_engine_compat

            version = server_version or spec.runtime.trtllm.version
            report.notes.append(f"engines {engine_dir} checked against TensorRT-LLM {version} on the server")
            report.add(BuildError, [f"engines: {p}" for p in check_engine_compat(engine_dir, version)])

    def build(self, spec, options):
        from trtspec import methods
        from trtspec.backends.trtllm_engine_methods import engine_method
        from trtspec.builders import trtllm_build

        return trtllm_build.build(spec, options, runtime=self.name, method=engine_method(spec),
                                  drafter=methods.get(spec.method))

    def emit_repository(self, spec: Spec, repo_dir: Path, engine_dir: Path) -> Path:
        from trtspec.backends.trtllm_engine_methods import engine_method
        from trtspec.builders.trtllm.memory import memory_plan
        from trtspec.builders.trtllm.plan import make_plan
        from trtspec.repository.trtllm.engine import render_engine_repository

        method = engine_method(spec)
        plan = make_plan(spec, method, engines_root=Path(engine_dir).parent)
        files = render_engine_repository(spec, method, engine_dirs={s.role: s.output_dir for s in plan.steps},
                                         memory=memory_plan(spec, method))
        return self.emit_files(spec, files, repo_dir)

    def bundle_payload(self, spec, out, manifest, repo_dst, img, engines_root):
        from trtspec.backends.bundle import engine_payload

        return engine_payload(spec, out, manifest, repo_dst, img, engines_root)

    def launch_command(self, spec: Spec, repo_dir: str | Path, **kwargs: Any) -> list[str]:
        from trtspec.backends.trtllm_engine_methods import engine_method
        from trtspec.repository.trtllm.launch import mpirun_command

        return mpirun_command(spec, engine_method(spec), repo_dir, **kwargs)

    def launch_world_size(self, spec: Spec) -> int:
        from trtspec.backends.trtllm_engine_methods import engine_method
        from trtspec.repository.trtllm.launch import mpirun_world_size

        return mpirun_world_size(spec, engine_method(spec))

    def launch_script_command(self, spec: Spec, repo_dir: str | Path) -> list[str]:
        from trtspec.backends.trtllm_engine_methods import engine_method
        from trtspec.repository.trtllm.launch import launch_script_command

        return launch_script_command(spec, engine_method(spec), repo_dir)
