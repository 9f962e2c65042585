"""The build lock `engines/<name>/trtspec.lock.json` (an artifacts.manifest of kind "lock"), and the
file helpers the builders use (defined once, in trtspec.artifacts.fs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.artifacts import fs, manifest
from trtspec.artifacts.fs import (  # noqa: F401
    atomic_dir,
    digest,
    file_digests,
    remove_stale,
    sha256_file,
    swap_in,
    temp_dir,
    tool_versions,
    write_json,
)

LOCK_NAME = manifest.FILE_NAMES[manifest.LOCK]
LOCK_FORMAT = 2  # 1: before the common manifest shape (such locks no longer match and are rebuilt)


def new_lock(*, inputs: Any, outputs: Any, **extra: Any) -> dict[str, Any]:
    return manifest.new(manifest.LOCK, LOCK_FORMAT, inputs=inputs, outputs=outputs, **extra)


def read_lock(engine_dir: Path) -> dict[str, Any] | None:
    return manifest.read(Path(engine_dir) / LOCK_NAME, manifest.LOCK)


def hash_tree(root: Path) -> dict[str, str]:
    """sha256 of every file under a build output (the lock itself aside)."""
    return fs.hash_tree(root, (LOCK_NAME,))


def tree_changes(root: Path, recorded: dict[str, str]) -> list[str]:
    return fs.tree_changes(root, recorded, (LOCK_NAME,))
