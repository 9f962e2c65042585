"""The state file `trtspec serve` writes for a background server: `.trtspec/serve-<name>.json`
(pid, its start time and command line, ports, urls, log path, shm prefix, the admin key), read by
`serve --stop`, `generate` (default URL) and `deploy` (admin key). It holds a secret: it is written
0600, atomically (a temp file renamed over it), in a directory made 0700.

It sits below both the server (trtspec.serve, which writes it) and its clients (trtspec.client, which read
the endpoints from it), so a client never imports the server package."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

STATE_DIR_ENV = "TRTSPEC_STATE_DIR"


def state_dir() -> Path:
    return Path(os.environ.get(STATE_DIR_ENV, ".trtspec"))


def state_path(name: str) -> Path:
    return state_dir() / f"serve-{name}.json"


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def write_state(path: Path, state: dict[str, Any]) -> Path:
    """Write `state` to `path` readable by its owner only, all or nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(state, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o600)  # (an existing temp file keeps its mode on O_CREAT)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
