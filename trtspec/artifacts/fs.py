"""Files on disk: atomic JSON and directory writes, content digests, tool versions.

Every output trtspec writes (build outputs, converted checkpoints, the demo family) appears complete or not
at all: a directory is written into a temp dir beside its final place and renamed in (`atomic_dir`,
`swap_in`), JSON through a temp file and a rename (`write_json`). A killed writer leaves only
`.<name>.{tmp,old,staging}-<pid>-*` dirs, which the next writer of the same name removes (`remove_stale`).
Digests are sha256 of file contents (`hashlib.file_digest`); `file_digests` caches them by (size, mtime_ns),
so re-checking an unchanged multi-GB checkpoint reads nothing.
"""

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

from trtspec.errors import BuildError, ModelError, TrtspecError
from trtspec.names import inside

# Not content: Python writes bytecode caches beside the model.py files Triton's Python backend imports.
IGNORED_DIRS = ("__pycache__",)
VERSIONED = ("trtspec", "torch", "transformers", "tokenizers", "safetensors")

# ----------------------------------------------------------------------------------------------- JSON


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object trtspec wrote (a manifest), or None when it is missing, unreadable or not an object:
    then whatever it described is simply made again."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: json.JSONDecodeError and UnicodeDecodeError
        return None
    return data if isinstance(data, dict) else None


def read_json_object(path: Path, what: str = "checkpoint", error: type[TrtspecError] = ModelError) -> dict[str, Any]:
    """The JSON object in a file someone else wrote (a checkpoint's config.json, tokenizer.json ...): `error`
    naming the file when it is missing, not UTF-8, not JSON or not an object (callers index it as a dict)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path}: not found", hint=f"point the spec at a directory holding the {what}") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not UTF-8 text", hint=f"re-export the {what} (JSON files are UTF-8)") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: invalid JSON: {exc}", hint=f"re-export the {what}") from None
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror or exc})", hint="check the file's permissions") from None
    if not isinstance(data, dict):
        kind = {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(data), "number")
        raise error(f"{path}: holds a JSON {kind}, not an object",
                    hint=f"re-export the {what}: it must be one JSON object {{...}}")
    return data


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (temp file in the same folder, then rename), readable like any written file."""
    write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def write_bytes(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write `data` atomically: a temp file in the same folder (created with its parents), then a rename; the
    file gets `mode`, by default what a plain `open(..., "w")` makes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, file_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# -------------------------------------------------------------------------------------------- digests


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def digest(obj: Any) -> str:
    """Stable sha256 of a JSON-serialisable value (sorted keys)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def list_files(root: Path, exclude: tuple[str, ...] = (), *, hidden: bool = True) -> list[Path]:
    """Files under `root`, sorted, never inside __pycache__; names in `exclude` skipped; hidden=False also
    skips dot-files and everything under dot-dirs (a checkpoint's `.git/`, a killed writer's temp dirs)."""
    root = Path(root)
    out = []
    for p in root.rglob("*"):
        parts = p.relative_to(root).parts
        if (p.is_file() and p.name not in exclude and not any(part in IGNORED_DIRS for part in parts)
                and (hidden or not any(part.startswith(".") for part in parts))):
            out.append(p)
    return sorted(out)


def hash_tree(root: Path, exclude: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file under root, keyed by its POSIX path relative to root (sorted)."""
    root = Path(root)
    return {p.relative_to(root).as_posix(): sha256_file(p) for p in list_files(root, exclude)}


def tree_changes(root: Path, recorded: dict[str, str], exclude: tuple[str, ...] = ()) -> list[str]:
    """How the files under `root` differ from `recorded` ({relative path: sha256}, as hash_tree gives):
    "<path> changed", "<path> missing", "<path> unexpected"; [] when identical. The file lists are compared
    first, so a missing or extra file is found without reading anything; the hashes are the truth."""
    root = Path(root)
    present = {p.relative_to(root).as_posix(): p for p in list_files(root, exclude)} if root.is_dir() else {}
    out = [f"{rel} missing" for rel in sorted(set(recorded) - set(present))]
    out += [f"{rel} unexpected" for rel in sorted(set(present) - set(recorded))]
    if out:
        return out
    return [f"{rel} changed" for rel, p in present.items() if sha256_file(p) != recorded[rel]]


def file_digests(paths: list[Path], root: Path | None = None, previous: dict[str, Any] | None = None,
                 use_cache: bool = True) -> dict[str, dict[str, Any]]:
    """{key: {"size", "mtime_ns", "sha256"}}; key is the path relative to root (POSIX) or absolute. A file
    whose (size, mtime_ns) equal the ones recorded in `previous` with its digest is not read again (writing
    a file changes its mtime, so an edited byte is always re-hashed); use_cache=False re-reads everything."""
    previous = previous or {}
    out: dict[str, dict[str, Any]] = {}
    for p in sorted(Path(x) for x in paths):
        st = p.stat()
        key = p.relative_to(root).as_posix() if root else str(p.resolve())
        old = previous.get(key)
        if (use_cache and isinstance(old, dict) and old.get("size") == st.st_size
                and old.get("mtime_ns") == st.st_mtime_ns and old.get("sha256")):
            sha = old["sha256"]
        else:
            sha = sha256_file(p)
        out[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha}
    return out


def content_only(digests: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Just {key: sha256}: what goes into content hashes (stat data is only a cache)."""
    return {k: v["sha256"] for k, v in sorted(digests.items())}


def tool_versions() -> dict[str, str]:
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for dist in VERSIONED:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "absent"
    return versions


# ------------------------------------------------------------------------------- atomic directories


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


def temp_dir(parent: Path, stem: str, kind: str = "tmp") -> Path:
    """A fresh dir `.<stem>.<kind>-<pid>-<random>` in `parent`, with a plain mkdir's mode. The pid in the
    name lets a later writer tell the leftovers of a killed one (`remove_stale`) from a live one's."""
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
    """Remove what killed writers left beside `parent/stem`: `.<stem>.{tmp,old,staging}-<pid>-*` dirs whose
    pid is no longer running (a SIGKILLed writer never reaches its cleanup). A live writer's are kept."""
    parent = Path(parent)
    pattern = re.compile(rf"\.{re.escape(stem)}\.(?:tmp|old|staging)-(\d+)(?:-.*)?")
    removed: list[Path] = []
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
    writers of the same `final` are removed first; `final` must be a plain name inside its parent.
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
