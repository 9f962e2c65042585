"""Names that become paths, and the guard on every write or delete under an output root.

A deployment name or a model name is also a directory name (`engines/<name>/`,
`model_repository/<name>/<model>/`), so a spec value like `serving.ensemble_name = ".."` once
made `trtspec build` delete everything under `--out-repo`. Two rules close that for good:

1. a name is ONE path component: `^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$` (so never `.`, `..`, empty,
   hidden, with a separator or a NUL), checked by the spec schema (`PathName`) and again by the
   emitters before they build a path (`check_name`);
2. every path a builder or emitter writes or deletes resolves strictly inside its own output root
   (`inside`), whatever the names, symlinked parents or manifests it was made from say.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator
from pydantic_core import PydanticCustomError

from trtspec.errors import RepositoryError, TrtspecError

MAX_NAME = 128
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
NAME_RULE = "1-128 letters, digits, '_', '-' or '.', starting with a letter or digit"

# Model names a deployment's repository already uses (torch and trtllm flavours) and its manifest:
# an ensemble of the same name would overwrite one of them.
RESERVED_MODEL_NAMES = ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_draft", "tensorrt_llm_bls",
                        "trtspec.repo.json")


def name_problem(value: object) -> str | None:
    """Why `value` cannot be used as one file or directory name, or None when it can."""
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if not value:
        return "is empty"
    if "\0" in value:
        return "contains a NUL byte"
    if "/" in value or "\\" in value:
        return "contains a path separator"
    if set(value) == {"."}:
        return "is a relative directory ('.' or '..')"
    if len(value) > MAX_NAME:
        return f"is longer than {MAX_NAME} characters"
    if not value[0].isascii() or not value[0].isalnum():
        return "does not start with a letter or digit"
    if not NAME_RE.fullmatch(value):
        return "has characters other than letters, digits, '_', '-' and '.'"
    return None


def check_name(value: object, what: str, error: type[TrtspecError] = RepositoryError) -> str:
    """`value` if it is one valid path component, else `error` naming `what`."""
    why = name_problem(value)
    if why:
        raise error(f"{what} {value!r} {why}: it becomes a directory name",
                    hint=f"use {NAME_RULE}")
    return value  # type: ignore[return-value]


def _validate(value: str) -> str:
    why = name_problem(value)
    if why:
        raise PydanticCustomError("path_name", "not usable as a directory name: {why}", {"why": why})
    return value


# A spec field whose value becomes a file or directory name.
PathName = Annotated[str, AfterValidator(_validate)]


def inside(root: Path, path: Path, error: type[TrtspecError] = RepositoryError) -> Path:
    """`path` (parents resolved, its last component kept as is) if it lies strictly inside `root`
    (resolved), else `error`. Use it on every path that is about to be written, replaced or deleted.

    The last component is not followed: replacing or deleting a symlink acts on the link itself."""
    root, path = Path(root).resolve(), Path(path)
    if path.name in ("", ".", ".."):
        raise error(f"refusing to write {path}: not a file or directory name inside {root}",
                    hint="every name that becomes a path must be one plain component")
    full = path.parent.resolve() / path.name
    if full == root or not full.is_relative_to(root):
        raise error(f"refusing to write {full}: outside the output directory {root}",
                    hint="every name that becomes a path must be one plain component")
    return full


def child(root: Path, name: str, what: str, error: type[TrtspecError] = RepositoryError) -> Path:
    """root/name for a checked one-component `name` (the builders' `engines/<name>` and friends)."""
    return inside(root, Path(root) / check_name(name, what, error), error)
