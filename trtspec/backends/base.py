"""The Backend interface: one object per runtime (`runtime.kind`), with everything trtspec does differently
for it. Nothing outside trtspec/backends/ compares runtime kinds: the composition points (trtspec.check, the
CLI) ask the registry (`backends.for_spec(spec)`, `backends.get(kind)`) and call these hooks. A backend is
itself a composition point: its hooks look the spec's method up (in trtspec.methods and in the runtime's own
method table, trtllm_engine_methods.py / trtllm_llmapi_methods.py) and pass what the builders, repositories
and servers below need as arguments.

    capabilities  devices, GPU or not, how many devices (TP x PP), dtypes, `trtspec deploy`
    problems      problems(spec): what the runtime cannot run, the spec alone (trtspec.check asks);
                  method_problems(spec): what it takes of the spec's method (its method table's refusals);
                  notes(spec): the spec keys it drops without effect (a note, never an error)
    check         check(spec, report, ...): what `trtspec check` adds (memory plan, built engines)
    build         build(spec, options): engines/<name>/ + model_repository/<name>/ (trtspec/builders/)
    repository    emit_repository(spec, repo_dir, engine_dir): the Triton repository for built engines
    serving       server(spec, options) -> trtspec.serve.Server; launch_command(...) for the TRT-LLM
                  container's server (launch_shell / bundles / CI render it)
    deploy        deploy(spec, url, server_repo, ...): onto a running server, where the runtime can

A backend module imports builders, repositories, servers and its method table inside its hooks only: the
registry is read at CLI start-up and by spec validation, which must stay light (no torch, no tritonclient).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from trtspec.errors import DeployError, RepositoryError
from trtspec.spec import Problem, Spec

if TYPE_CHECKING:
    from trtspec.builders import BuildOptions, BuildResult
    from trtspec.serve import ServeOptions, Server
    from trtspec.serve.deploy import DeployResult

DEVICE_NAMES = {"cpu": "CPU", "cuda": "CUDA"}


def written(spec: Spec, dotted: str) -> bool:
    """Whether the spec's file wrote the key `dotted` ("speculative.ngram.candidates"): a default it never wrote
    is no choice of the user's, so a runtime that drops it has nothing to tell."""
    obj: Any = spec
    for part in dotted.split("."):
        if part not in getattr(obj, "model_fields_set", ()):
            return False
        obj = getattr(obj, part)
    return True


def dropped_notes(spec: Spec, runtime: str, dropped: dict[str, str]) -> list[str]:
    """The notes for the keys of `dropped` (dotted key -> why the runtime drops it) the spec writes."""
    return [f"{key} has no effect under runtime '{runtime}': {why}" for key, why in dropped.items()
            if written(spec, key)]


@dataclasses.dataclass(frozen=True)
class Capabilities:
    devices: tuple[str, ...]                 # runtime.device values it runs on
    gpu: bool                                # needs a GPU (gpu.type other than cpu)
    max_world_size: int | None               # tensor x pipeline parallel it runs (None: what gpu.count allows)
    dtypes: tuple[str, ...] = ("float32", "float16", "bfloat16")
    deploy: bool = False                     # `trtspec deploy` onto a running Triton server


class Backend:
    name: ClassVar[str] = ""
    capabilities: ClassVar[Capabilities]

    def __repr__(self) -> str:
        return f"<backend {self.name}>"

    # ------------------------------------------------------------------------------------------ spec rules

    def problems(self, spec: Spec) -> list[Problem]:
        """What this runtime cannot run, from the spec alone: its devices, a GPU, its parallelism, its dtypes
        (the spec's validation asks; what it takes of the spec's method: `method_problems`)."""
        from trtspec import backends

        caps, rt, gpu, p = self.capabilities, spec.runtime, spec.gpu, []
        if caps.gpu and gpu.type == "cpu":
            cpu = [b.name for b in backends.registered() if not b.capabilities.gpu]
            p.append(Problem("gpu.type", gpu.type, f"runtime '{self.name}' needs a GPU",
                             "set gpu.type = \"h100\" or \"h200\""
                             + (f", or runtime.kind = \"{cpu[0]}\"" if cpu else "")))
        if rt.device not in caps.devices:
            where = " or ".join(DEVICE_NAMES.get(d, d) for d in caps.devices)
            p.append(Problem("runtime.device", rt.device, f"runtime '{self.name}' runs on {where} only",
                             f"set runtime.device = \"{caps.devices[0]}\""))
        if caps.max_world_size is not None and spec.world_size > caps.max_world_size:
            p.append(self.world_size_problem(spec))
        key, dtype = self.dtype(spec)
        if dtype not in caps.dtypes:
            p.append(Problem(key, dtype, f"runtime '{self.name}' does not serve it", f"use {' or '.join(caps.dtypes)}"))
        return p

    def dtype(self, spec: Spec) -> tuple[str, str]:
        """(spec key, value) of the dtype this runtime serves the spec in."""
        return "model.dtype", spec.model.dtype

    def world_size_problem(self, spec: Spec) -> Problem:
        return Problem("gpu.tensor_parallel", spec.gpu.tensor_parallel,
                       f"runtime '{self.name}' runs on at most {self.capabilities.max_world_size} devices",
                       f"set tensor_parallel x pipeline_parallel <= {self.capabilities.max_world_size}")

    def method_problems(self, spec: Spec) -> list[Problem]:
        """The spec's method on this runtime, as the methods registry states it (a method the runtime refuses,
        or a limit of its engines)."""
        return []

    def notes(self, spec: Spec) -> list[str]:
        """What `trtspec check` tells about the spec on this runtime without failing: the spec keys the runtime
        drops without effect (its method table lists them), what of its version was not verified."""
        return []

    def check(self, spec: Spec, report: Any, *, models: bool, engines: Path | None,
              server_version: str | None) -> None:
        """What `trtspec check` adds for this runtime to `report` (a trtspec.check.CheckReport)."""

    # ------------------------------------------------------------------------------------------ build

    def build(self, spec: Spec, options: BuildOptions) -> BuildResult:
        raise NotImplementedError

    def emit_repository(self, spec: Spec, repo_dir: Path, engine_dir: Path) -> Path:
        """Write the Triton repository `repo_dir` (atomically) for the engines built in `engine_dir`."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ serving

    def server(self, spec: Spec, options: ServeOptions) -> Server:
        raise NotImplementedError

    def launch_command(self, spec: Spec, repo_dir: str | Path, **kwargs: Any) -> list[str]:
        """The TensorRT-LLM container's server argv for the repository (see trtspec.repository.trtllm.launch)."""
        raise RepositoryError(f"launch_command is for the trtllm runtimes, not {self.name!r}")

    def launch_world_size(self, spec: Spec) -> int:
        """MPI processes `launch_command` starts."""
        return 1

    def launch_script_command(self, spec: Spec, repo_dir: str | Path) -> list[str]:
        """The equivalent call of the container's launch_triton_server.py (for docs / an image's CMD)."""
        from trtspec import backends

        users = [b.name for b in backends.registered() if type(b).launch_script_command
                 is not Backend.launch_script_command]
        raise RepositoryError(f"launch_triton_server.py is for the {' and '.join(users)} runtime")

    def bundle_payload(self, spec: Spec, out: Path, manifest: dict[str, Any], repo_dst: Path, img: Path,
                       engines_root: Path) -> dict[str, str]:
        """What a serving image's bundle carries besides the repository (trtspec.backends.bundle); {what: path
        in the image}."""
        raise RepositoryError(f"a serving image bundle is for the trtllm runtimes, not {self.name!r}",
                              hint="serve the torch runtime with `trtspec serve` or `trtspec deploy`")

    # ------------------------------------------------------------------------------------------ deploy

    def deploy(self, spec: Spec, url: str, server_repo: str | Path, **kwargs: Any) -> DeployResult:
        """`trtspec deploy`: the build onto the running server at `url` (trtspec.serve.deploy)."""
        from trtspec import backends

        if not self.capabilities.deploy:
            able = " and ".join(repr(b.name) for b in backends.registered() if b.capabilities.deploy)
            raise DeployError(f"deploy supports runtime {able} only, not {self.name!r}",
                              hint="deploy trtllm repositories with the Triton TRT-LLM container's tooling")
        from trtspec.serve.deploy import deploy_spec

        return deploy_spec(spec, url, server_repo, **kwargs)
