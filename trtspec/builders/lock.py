"""Content hashes, the lock manifest (`trtspec.lock.json`) and atomic directory writes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtspec.errors import BuildError
from trtspec.names import inside

LOCK_NAME = "trtspec.lock.json"
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


# Not content: Python writes bytecode caches beside the model.py files Triton's Python backend imports.
IGNORED_DIRS = ("__pycache__",)


def content_files(root: Path, exclude: tuple[str, ...] = (LOCK_NAME,)) -> list[Path]:
    root = Path(root)
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name not in exclude
                  and not any(part in IGNORED_DIRS for part in p.relative_to(root).parts))


def hash_tree(root: Path, exclude: tuple[str, ...] = (LOCK_NAME,)) -> dict[str, str]:
    """sha256 of every file under root, keyed by its POSIX path relative to root (sorted)."""
    root = Path(root)
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in content_files(root, exclude)}


def tree_changes(root: Path, recorded: dict[str, str]) -> list[str]:
    """How the files under `root` differ from `recorded` ({relative path: sha256}, as hash_tree gives):
    "<path> changed", "<path> missing", "<path> unexpected"; [] when identical. The file lists are compared
    first, so a missing or extra file is found without reading anything; the hashes are the truth."""
    root = Path(root)
    present = {p.relative_to(root).as_posix(): p for p in content_files(root)} if root.is_dir() else {}
    out = [f"{rel} missing" for rel in sorted(set(recorded) - set(present))]
    out += [f"{rel} unexpected" for rel in sorted(set(present) - set(recorded))]
    if out:
        return out
    return [f"{rel} changed" for rel, p in present.items() if sha256_file(p) != recorded[rel]]


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


def _umask() -> int:
    """The process umask, read without changing it where the OS allows (/proc), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def dir_mode() -> int:
    """What a plain `mkdir` makes (0755 under umask 022): tempfile's 0700 would hide build outputs from
    the (non-root) user a serving container runs as."""
    return 0o777 & ~_umask()


def file_mode() -> int:
    """What a plain `open(..., "w")` makes (0644 under umask 022), not mkstemp's 0600."""
    return 0o666 & ~_umask()


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file in the same folder, then rename), readable like any written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


def temp_dir(parent: Path, stem: str, kind: str = "tmp") -> Path:
    """A fresh dir `.<stem>.<kind>-<pid>-<random>` in `parent`, with a plain mkdir's mode. The pid in the
    name lets a later build tell the leftovers of a killed build (`remove_stale`) from a live one's."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{stem}.{kind}-{os.getpid()}-", dir=parent))
    tmp.chmod(dir_mode())
    return tmp


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def remove_stale(parent: Path, stem: str) -> list[Path]:
    """Remove what killed builds left beside `parent/stem`: `.<stem>.{tmp,old,staging}-<pid>-*` dirs whose
    pid is no longer running (a SIGKILLed build never reaches its cleanup). A live build's are kept."""
    parent = Path(parent)
    pattern = re.compile(rf"\.{re.escape(stem)}\.(?:tmp|old|staging)-(\d+)(?:-.*)?")
    removed = []
    if not parent.is_dir():
        return removed
    for p in sorted(parent.iterdir()):
        m = pattern.fullmatch(p.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            p = inside(parent, p, BuildError)
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a fresh temp dir beside `final`; on success it replaces `final` in one rename.

    On any error the temp dir is removed and `final` is left exactly as it was. Leftovers of killed
    builds of the same `final` are removed first; `final` must be a plain name inside its parent.
    """
    final = inside(Path(final).parent, Path(final), BuildError)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(final.parent, final.name)
    tmp = temp_dir(final.parent, final.name)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in(tmp, final)


def plain_modes(root: Path) -> None:
    """Give everything under `root` the mode a plain mkdir/open would (umask applied, executables kept):
    mkdtemp, mkstemp and safetensors' writer make 0700/0600, unreadable for a container's non-root user."""
    mask = _umask()
    for p in [Path(root), *Path(root).rglob("*")]:
        if p.is_symlink():
            continue
        mode = stat.S_IMODE(p.stat().st_mode)
        want = (0o777 if p.is_dir() or mode & 0o111 else 0o666) & ~mask
        if mode != want:
            p.chmod(want)


def swap_in(stage: Path, final: Path) -> None:
    """Replace `final` by the ready directory `stage` (same filesystem); `final` is restored on failure.
    `stage` gets plain modes first (see plain_modes)."""
    final = inside(Path(final).parent, Path(final), BuildError)
    plain_modes(stage)
    old = final.with_name(f".{final.name}.old-{os.getpid()}-{os.urandom(4).hex()}")
    if final.exists() or final.is_symlink():
        os.replace(final, old)
    try:
        os.replace(stage, final)
    except BaseException:
        if old.exists() or old.is_symlink():
            os.replace(old, final)
        raise
    if old.is_symlink():
        old.unlink()
    else:
        shutil.rmtree(old, ignore_errors=True)
