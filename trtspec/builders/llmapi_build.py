"""Builder for runtime `trtllm-llmapi`: no engine build; emits model_repository/<name>/ with the
llmapi `tensorrt_llm` model and its `model.yaml` (speculative_config, triton_config), and records
the HF checkpoints it points at in engines/<name>/trtspec.lock.json.

`--dry-run` returns one plan step whose `shell` is the model.yaml that would be written.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trtspec.artifacts.fs import file_digests, list_files
from trtspec.builders import BuildOptions, BuildResult
from trtspec.builders.lock import LOCK_NAME, digest, new_lock, read_lock, write_json
from trtspec.builders.trtllm_build import check_weights, emit_repository, repository_changes
from trtspec.errors import BuildError
from trtspec.methods.base import Method
from trtspec.names import child
from trtspec.repository.trtllm.llmapi import MODEL, render_llmapi_repository
from trtspec.spec import Spec


def _sources(spec: Spec, method: Method) -> list[Path]:
    """The files of the checkpoints the LLM API loads: the target and its method's own."""
    dirs = [Path(spec.model.target), *method.checkpoints(spec).values()]
    return [f for d in dirs if d.is_dir() for f in list_files(d, hidden=False)]


def build(spec: Spec, options: BuildOptions, *, runtime: str, method: Method, method_args: dict[str, Any]
          ) -> BuildResult:
    """Render, write the repository if it changed, record the checkpoints (`runtime`: the backend's name;
    `method`: the spec's; `method_args`: its LLM(...) arguments, from the runtime's method table)."""
    t0 = time.perf_counter()
    repo_dir = child(Path(options.out_repo), spec.name, "model.name", BuildError)
    files = render_llmapi_repository(spec, method_args, repo_dir)  # checkpoint paths relative to the repository
    yaml_text = files[f"{MODEL}/1/model.yaml"]
    step = {"role": "model.yaml", "argv": [], "shell": yaml_text.rstrip("\n")}
    if options.dry_run:
        return BuildResult(runtime, {}, str(repo_dir), None, [], [], [step], time.perf_counter() - t0, True)
    root = child(Path(options.out_engines), spec.name, "model.name", BuildError)
    check_weights(spec, method)  # the LLM API loads these checkpoints as they are
    lock = read_lock(root) or {}
    prev = lock.get("inputs") if lock.get("runtime") == runtime else None
    sources = file_digests(_sources(spec, method), previous=prev, use_cache=not options.force)
    repo_digest = digest(files)
    changes = repository_changes(repo_dir, files, (lock.get("repository") or {}).get("digest"))
    changed = options.force or bool(changes)
    if changed:
        emit_repository(spec, files, repo_dir)
    write_json(root / LOCK_NAME, new_lock(
        inputs=sources, outputs={"repository": str(repo_dir)}, runtime=runtime, name=spec.name, method=spec.method,
        trtllm={"version": spec.runtime.trtllm.version, "image": spec.runtime.trtllm.image},
        repository={"path": str(repo_dir), "digest": repo_digest}, spec=spec.to_dict()))
    reason = "--force" if options.force else (changes[0] if changes and lock else "")
    return BuildResult(runtime, {}, str(repo_dir), str(root / LOCK_NAME), ["repository"] if changed else [],
                       [] if changed else ["repository"], [step], time.perf_counter() - t0, False, reason)
