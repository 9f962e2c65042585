"""One manifest shape for what trtspec writes beside its outputs.

    {"kind": "lock" | "convert" | "repository" | "demo-family" | "import",
     "format": <int, per kind>,
     "created": "<ISO 8601 UTC>" | None,
     "versions": {"python", "trtspec", "torch", ...},
     "inputs": what it was made from (paths, file digests),
     "outputs": what was written (files and their digests),
     ...kind-specific keys}

Files: `engines/<name>/trtspec.lock.json` (builds), `<checkpoint>/trtspec.convert.json` (conversions),
`model_repository/<name>/trtspec.repo.json` (TensorRT-LLM repositories), `examples/models/MANIFEST.json`
(the demo family), `<checkpoint>/trtspec.import.json` (GGUF imports, artifacts/gguf.py), `<drafter>/trtspec.train.json`
(drafters trained by `trtspec train`: data, budget, losses, measured acceptance). Written atomically. A rendered
repository's manifest has `created: None`: it is part of the rendered files, whose digest decides whether the
repository is written again, so equal renders must be equal bytes.

Reading is tolerant: a missing, unreadable or foreign file reads as None and whatever it described is made
again; a file from before this shape (no "kind") is returned as it is, so its own keys still answer (old
locks simply fail their key comparison and are rebuilt), except the demo family's, which is upgraded in
memory (the shipped one is not retrained).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from trtspec.artifacts import fs

LOCK, CONVERT, REPOSITORY, DEMO, IMPORT, TRAIN = "lock", "convert", "repository", "demo-family", "import", "train"
FILE_NAMES = {LOCK: "trtspec.lock.json", CONVERT: "trtspec.convert.json", REPOSITORY: "trtspec.repo.json",
              DEMO: "MANIFEST.json", IMPORT: "trtspec.import.json", TRAIN: "trtspec.train.json"}
_NOW = object()


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def new(kind: str, format: int, *, inputs: Any, outputs: Any, created: str | None | object = _NOW,
        versions: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """A manifest of `kind`; `created` defaults to now, `versions` to the tool versions of this process."""
    return {"kind": kind, "format": format, "created": now() if created is _NOW else created,
            "versions": fs.tool_versions() if versions is None else versions, "inputs": inputs, "outputs": outputs,
            **extra}


def write(path: Path, manifest: dict[str, Any]) -> None:
    fs.write_json(path, manifest)


def read(path: Path, kind: str | None = None) -> dict[str, Any] | None:
    """The manifest in `path`, or None when it is missing, unreadable, or of another kind."""
    data = fs.read_json(path)
    if data is None or "kind" not in data:
        return _upgrade(data, kind)
    return data if kind is None or data["kind"] == kind else None


def _upgrade(data: dict[str, Any] | None, kind: str | None) -> dict[str, Any] | None:
    if data is not None and kind == DEMO and str(data.get("created_by", "")).startswith("trtspec models train-demo"):
        rest = {k: v for k, v in data.items() if k not in ("corpus", "files")}
        return {**rest, "kind": DEMO, "created": None, "inputs": {"corpus": data.get("corpus", {})},
                "outputs": data.get("files", {})}
    return data


def file_table(root: Path, exclude: tuple[str, ...] = tuple(FILE_NAMES.values())) -> dict[str, dict[str, Any]]:
    """{relative path: {"sha256", "bytes"}} of every file under root but manifests: a manifest's outputs."""
    root = Path(root)
    return {rel: {"sha256": sha, "bytes": (root / rel).stat().st_size}
            for rel, sha in fs.hash_tree(root, exclude).items()}
