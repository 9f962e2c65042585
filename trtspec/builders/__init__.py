"""`trtspec build`: per-runtime builders behind one interface.

A builder is a function `build(spec, options) -> BuildResult` living in the module named in
BUILDERS; it writes `engines/<name>/` (with `trtspec.lock.json`) and `model_repository/<name>/`
atomically (see trtspec.builders.lock.atomic_dir): a failed build leaves previous outputs untouched.
"""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Callable

from trtspec.spec import Spec

BUILDERS = {
    "torch": "trtspec.builders.torch_build",
    "trtllm-engine": "trtspec.builders.trtllm_build",
    "trtllm-llmapi": "trtspec.builders.llmapi_build",
}


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    out_engines: Path = Path("engines")
    out_repo: Path = Path("model_repository")
    dry_run: bool = False              # print the plan, run nothing (trtllm-engine)
    force: bool = False                # rebuild even when the lock says nothing changed
    trtllm_build: str | None = None    # override spec.runtime.trtllm.trtllm_build
    progress: bool = True              # rich progress / live logs on stderr


@dataclasses.dataclass
class BuildResult:
    runtime: str
    engines: dict[str, str]            # model role -> engine dir
    repository: str | None             # model_repository/<name>
    lock: str | None                   # path of the lock manifest written
    rebuilt: list[str]                 # roles rebuilt this time ([] = cache hit)
    skipped: list[str]                 # roles unchanged (cache hit)
    plan: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # commands (trtllm-engine)
    seconds: float = 0.0
    dry_run: bool = False
    reason: str = ""                   # why it was rebuilt ("" when nothing was)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def builder_for(kind: str) -> Callable[[Spec, BuildOptions], BuildResult]:
    module = importlib.import_module(BUILDERS[kind])
    return module.build


def build(spec: Spec, options: BuildOptions) -> BuildResult:
    """Validate the spec's models and build what its runtime needs."""
    return builder_for(spec.runtime.kind)(spec, options)
