"""Content hashes, the lock manifest (`trtspec.lock.json`) and atomic directory writes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOCK_NAME = "trtspec.lock.json"
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def hash_tree(root: Path, exclude: tuple[str, ...] = (LOCK_NAME,)) -> dict[str, str]:
    """sha256 of every file under root, keyed by its POSIX path relative to root (sorted)."""
    root = Path(root)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name not in exclude)
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in files}


def digest(obj: Any) -> str:
    """Stable sha256 of a JSON-serialisable value (sorted keys)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def tool_versions() -> dict[str, str]:
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for dist in ("trtspec", "torch", "transformers", "tokenizers", "safetensors"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "absent"
    return versions


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file in the same folder, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON manifest, or None when it is missing or unreadable (then it is simply rebuilt)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def read_lock(engine_dir: Path) -> dict[str, Any] | None:
    return read_json(Path(engine_dir) / LOCK_NAME)


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temp dir beside `final`; on success it replaces `final` in one rename.

    On any error the temp dir is removed and `final` is left exactly as it was.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in(tmp, final)


def swap_in(stage: Path, final: Path) -> None:
    """Replace `final` by the ready directory `stage` (same filesystem); `final` is restored on failure."""
    old = final.with_name(f".{final.name}.old-{os.getpid()}")
    if final.exists():
        os.replace(final, old)
    try:
        os.replace(stage, final)
    except BaseException:
        if old.exists():
            os.replace(old, final)
        raise
    shutil.rmtree(old, ignore_errors=True)
