"""Deploy records (beside the build output) and the pruning of old backups (beside the server repository)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from trtspec.artifacts.fs import read_json, write_json
from trtspec.errors import DeployError
from trtspec.names import check_name
from trtspec.serve.deploy.layout import _remove

RECORDS_DIR = ".deployments"           # <engines>/.deployments/<name>/<revision>.json (see records_dir)


def records_dir(out_engines: Path, name: str) -> Path:
    """Where a deployment's records live: `<engines>/.deployments/<name>/`, beside the build output
    `<engines>/<name>/` rather than in it (the build lock hashes every file there and a rebuild replaces the
    directory whole)."""
    return Path(out_engines).resolve() / RECORDS_DIR / check_name(name, "deployment name", DeployError)


def write_record(out_engines: Path, name: str, record: dict[str, Any]) -> Path:
    """One JSON record per deploy or rollback, named by its revision (sortable by time), written atomically."""
    record = {"format": 1, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}
    path = records_dir(out_engines, name) / f"{record['revision']}.json"
    write_json(path, record)
    return path


def read_records(out_engines: Path, name: str, server_repo: Path | None = None) -> list[dict[str, Any]]:
    """The records, oldest first (unreadable files skipped); only those for `server_repo` when given."""
    folder = records_dir(out_engines, name)
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        rec = read_json(path)
        if isinstance(rec, dict) and rec.get("revision") and (
                server_repo is None or rec.get("server_repo") == str(Path(server_repo).resolve())):
            out.append({**rec, "_path": str(path)})
    return out


def prune_backups(backups: Path, keep: int) -> list[str]:
    """Remove all but the newest `keep` backup dirs in `backups` (DIR.trtspec/backups/: names sort by time);
    returns the removed ones."""
    found = sorted(p for p in Path(backups).iterdir() if p.is_dir()) if Path(backups).is_dir() else []
    gone = found[:max(0, len(found) - max(keep, 1))]
    for p in gone:
        _remove(p)
    return [p.name for p in gone]
