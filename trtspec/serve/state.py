"""The state file `trtspec serve` writes for a background server: `.trtspec/serve-<name>.json`
(pid, ports, urls, log path, shm prefix), read by `serve --stop` and `generate` (default URL)."""

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
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
