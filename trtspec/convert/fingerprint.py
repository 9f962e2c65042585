"""File fingerprints with a stat cache.

`sha256` of every file, but a file whose (size, mtime_ns) equal the ones recorded with its
previous digest is not read again: re-checking an unchanged multi-GB checkpoint takes
milliseconds. Writing to a file changes its mtime, so an edited byte is always re-hashed;
`--force` on the CLI bypasses the cache entirely.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.builders.lock import sha256_file


def file_digests(paths: list[Path], root: Path | None = None, previous: dict[str, Any] | None = None,
                 use_cache: bool = True) -> dict[str, dict[str, Any]]:
    """{key: {"size", "mtime_ns", "sha256"}}; key is the path relative to root (POSIX) or absolute."""
    previous = previous or {}
    out: dict[str, dict[str, Any]] = {}
    for p in sorted(Path(x) for x in paths):
        st = p.stat()
        key = p.relative_to(root).as_posix() if root else str(p.resolve())
        old = previous.get(key)
        if (use_cache and isinstance(old, dict) and old.get("size") == st.st_size
                and old.get("mtime_ns") == st.st_mtime_ns and old.get("sha256")):
            digest = old["sha256"]
        else:
            digest = sha256_file(p)
        out[key] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    return out


def content_only(digests: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Just {key: sha256}: what goes into content hashes (stat data is only a cache)."""
    return {k: v["sha256"] for k, v in sorted(digests.items())}


def tree_files(root: Path, exclude_names: tuple[str, ...] = ()) -> list[Path]:
    root = Path(root)
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name not in exclude_names
                  and not any(part.startswith(".") for part in p.relative_to(root).parts))
