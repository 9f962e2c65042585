"""`trtspec build`: one builder module per runtime, behind one interface.

`trtspec.backends.build(spec, options)` asks the spec's backend, which runs its builder: a function
`build(spec, options, runtime=<its name>, ...) -> BuildResult` (torch_build, trtllm_build, llmapi_build) to which
it passes what the builder needs of the spec's method (the method, its row of the runtime's method table, its
LLM(...) arguments). A builder writes `engines/<name>/` (with `trtspec.lock.json`, naming the runtime) and
`model_repository/<name>/` atomically (see trtspec.builders.lock.atomic_dir): a failed build leaves
previous outputs untouched.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any


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
