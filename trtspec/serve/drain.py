"""Draining a server before it stops, so that the requests in flight finish.

Triton's own SIGTERM path cannot finish a streamed *ensemble* request (it stops the step models'
schedulers first, the next step's internal request fails to enqueue and the ensemble never completes;
its clients hang until the exit timeout). So before the SIGTERM trtspec closes the front door itself
(unloads the ensembles, whose requests in flight still complete), writes `<work>/control/drain.json`
with a deadline that the generation models read (they cut what still runs at the deadline with a final
"shutdown" error; trtspec.repository.serving), and waits for both.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from trtspec.repository.serving import DRAIN_FILE
from trtspec.serve.control import ModelControl
from trtspec.serve.processes import pid_alive

DRAIN_MARGIN = 5.0                                       # seconds past the drain deadline for the last responses


def request_drain(control_dir: str | Path, timeout: float, refuse_new: bool) -> float:
    """Write `<control>/drain.json` (atomically) for the generation models; returns the deadline
    (time.monotonic(): one clock for every process of this machine)."""
    control = Path(control_dir)
    control.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + max(0.0, timeout)
    tmp = control / f".{DRAIN_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps({"deadline": deadline, "refuse_new": refuse_new}), encoding="utf-8")
    os.replace(tmp, control / DRAIN_FILE)
    return deadline


def _undrained(control: Path) -> list[int]:
    """Generation instances (their stub pids) that announced themselves and have not drained yet."""
    pending = []
    for path in control.glob("instance-*"):
        pid = path.name.removeprefix("instance-")
        if pid.isdigit() and not (control / f"drained-{pid}").exists() and pid_alive(int(pid)):
            pending.append(int(pid))
    return pending


def drain_server(http_url: str, control_dir: str | Path, timeout: float, *, admin_key: str | None = None,
                 explicit: bool = True, alive=lambda: True) -> dict[str, Any]:
    """Let a running trtspec-started server finish its requests before it gets SIGTERM.

    1. `drain.json` tells the generation models the deadline (now + `timeout`); at the deadline they end
       whatever still runs with a final "shutdown" error. Without explicit model control they also
       refuse new requests at once.
    2. Explicit model control: the ensembles are unloaded. Triton then refuses new requests to them,
       lets the ones in flight finish (their steps stay loaded), and lists them as UNAVAILABLE when
       the last one is done: that is the exact "nothing in flight" signal.
    3. Wait until the ensembles are unloaded and every generation instance has drained, until the
       deadline + DRAIN_MARGIN, or until the server is gone (`alive()` false).
    Returns what happened: seconds, whether it finished before the deadline, the ensembles unloaded."""
    start = time.monotonic()
    control = Path(control_dir)
    deadline = request_drain(control, timeout, refuse_new=not explicit)
    ensembles: list[str] = []
    models = None
    if explicit:
        try:
            models = ModelControl(http_url, admin_key, timeout=10.0)
            for model in models.entries():
                name = model.get("name")
                if model.get("state") == "READY" and models.config(name).get("platform") == "ensemble":
                    models.unload(name)
                    ensembles.append(name)
        except Exception:  # noqa: BLE001 - no model control (wrong key, old server): the markers still tell
            if models is not None:
                models.close()
            models = None
    busy: list[str] = []
    try:
        while alive():
            busy = []
            if models is not None:
                try:
                    states = models.index()
                    busy = [e for e in ensembles if states.get(e) in ("READY", "UNLOADING")]
                except Exception:  # noqa: BLE001
                    busy = []
            if not busy and not _undrained(control):
                break
            if time.monotonic() > deadline + DRAIN_MARGIN:
                break
            time.sleep(0.05)
    finally:
        if models is not None:
            models.close()
    elapsed = time.monotonic() - start
    return {"seconds": round(elapsed, 3), "timeout": timeout, "in_time": time.monotonic() <= deadline,
            "unloaded": ensembles, "still_busy": busy}
