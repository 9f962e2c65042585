"""A bundled server in the background: what `trtspec serve` / `serve --stop` do, with the state file
`.trtspec/serve-<name>.json` (trtspec.state; 0600: it holds the admin key).

The recorded pid is only ever signalled while it is still the process trtspec started (its start time
and command line match): a reused pid is left alone, and a server that is gone only has its leftovers
(stub processes, /dev/shm regions, work dir) cleaned up.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from trtspec.errors import ServeError
from trtspec.serve.drain import drain_server
from trtspec.serve.processes import clean_leftovers, is_our_server, pid_alive, proc_cmdline, stop_pid
from trtspec.serve.server import TritonServer
from trtspec.spec import Spec
from trtspec.state import read_state, state_dir, state_path, write_state


def repository_dir(spec: Spec, out_repo: str | Path = "model_repository") -> Path:
    path = Path(out_repo) / spec.name
    if not (path / spec.serving.ensemble_name / "config.pbtxt").is_file():
        raise ServeError(f"no model repository for {spec.name!r} at {path}",
                         hint=f"run `trtspec build -c {spec.source or 'SPEC'}` first")
    return path


def server_for_spec(spec: Spec, *, out_repo: str | Path = "model_repository", http_port: int | None = None,
                    grpc_port: int | None = None, metrics_port: int | None = None, host: str | None = None,
                    **kwargs: Any) -> TritonServer:
    """A TritonServer for the spec's built repository; ports default to the spec's serving.* (0 = free),
    the bind address to 127.0.0.1 (not a spec key: where a server listens is the operator's choice at
    start, and the spec is part of the build's lock key)."""
    s = spec.serving
    return TritonServer(repository_dir(spec, out_repo),
                        http_port=s.http_port if http_port is None else http_port,
                        grpc_port=s.grpc_port if grpc_port is None else grpc_port,
                        metrics_port=s.metrics_port if metrics_port is None else metrics_port,
                        host=host or "127.0.0.1", **kwargs)


def _ours(state: dict[str, Any] | None) -> bool:
    """The recorded server is alive and is the process trtspec started: same start time and command
    line (a reused pid is not). A state written before those were recorded is matched by the server's
    unique shared-memory prefix on its command line."""
    pid = state.get("pid") if state else None
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    if state.get("start_time") or state.get("cmdline"):
        return is_our_server(pid, state.get("start_time"), state.get("cmdline"))
    prefix = state.get("shm_prefix") or ""
    return bool(prefix) and f"shm-region-prefix-name={prefix}" in " ".join(proc_cmdline(pid) or [])


def running_state(name: str) -> dict[str, Any] | None:
    """The recorded background server of deployment `name`, if it is still running."""
    state = read_state(state_path(name))
    return state if _ours(state) else None


def admin_key_for(http_url: str) -> str | None:
    """The admin key of the running `trtspec serve` server whose HTTP port is `http_url`'s."""
    port = http_url.rstrip("/").rpartition(":")[2]
    for path in sorted(state_dir().glob("serve-*.json")):
        state = read_state(path)
        if state and str(state.get("http_port")) == port and _ours(state):
            return state.get("admin_key")
    return None


def _clean(state: dict[str, Any], work_dir: bool) -> dict[str, list]:
    return clean_leftovers(str(state.get("shm_prefix") or ""), state.get("work_dir") if work_dir else None)


def start_background(spec: Spec, **kwargs: Any) -> dict[str, Any]:
    """Start the server detached (it outlives this process); record and return its state.

    A state left by a server that is gone (killed, crashed, or its pid now someone else's) is cleaned
    up first: its stub processes, its /dev/shm regions and its work dir; `cleaned` says what."""
    path = state_path(spec.name)
    old = read_state(path)
    cleaned = None
    if old is not None:
        if _ours(old):
            raise ServeError(f"a server for {spec.name!r} is already running (pid {old['pid']}, "
                             f"gRPC {old.get('grpc_url')})", hint="stop it with `trtspec serve --stop`")
        cleaned = _clean(old, work_dir=True)
        path.unlink(missing_ok=True)
    state_dir().mkdir(parents=True, exist_ok=True, mode=0o700)  # (before the work dir in it)
    work = state_dir() / f"serve-{spec.name}"
    if work.exists():
        shutil.rmtree(work, ignore_errors=True)
    server = server_for_spec(spec, work_dir=work, **kwargs)
    server.start(wait=False)
    try:
        server.wait_ready()
    except BaseException:
        server.stop(grace=2.0, drain=False)
        raise
    state = server.state() | {"name": spec.name, "ensemble": spec.serving.ensemble_name}
    write_state(path, state)
    return state | ({"cleaned": cleaned} if cleaned and any(cleaned.values()) else {})


def stop_background(name: str, grace: float | None = None, drain_timeout: float | None = None
                    ) -> dict[str, Any] | None:
    """Stop the recorded background server of `name` (None if none was recorded): drain it (requests
    in flight finish, up to its drain timeout), SIGTERM, SIGKILL after its exit timeout + 5 s (or
    `grace`). Only a process that is the recorded server is signalled; otherwise the state is stale
    (`outcome` says which) and only the recorded server's leftovers are cleaned."""
    path = state_path(name)
    state = read_state(path)
    if state is None:
        return None
    pid = state.get("pid")
    outcome = "not running"
    if _ours(state):
        timeout = float(state.get("drain_timeout", 30.0) if drain_timeout is None else drain_timeout)
        started = time.monotonic()
        if state.get("control_dir") and state.get("http_url"):
            state["drain"] = drain_server(state["http_url"], state["control_dir"], timeout,
                                          admin_key=state.get("admin_key"),
                                          explicit=state.get("model_control") == "explicit",
                                          alive=lambda: _ours(state))
        if _ours(state):  # (still the same process right before the signal)
            wait = grace if grace is not None else float(state.get("exit_timeout", 10)) + 5
            stop_pid(int(pid), grace=wait)
        outcome, state["seconds"] = "stopped", round(time.monotonic() - started, 3)
    elif isinstance(pid, int) and pid_alive(pid):
        outcome = "pid reused"
        state["pid_now"] = " ".join(proc_cmdline(pid) or [])[:120]
    state["cleaned"] = _clean(state, work_dir=False)
    path.unlink(missing_ok=True)
    state["outcome"] = outcome
    return state
