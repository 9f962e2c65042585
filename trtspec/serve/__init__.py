"""Serving a built deployment on the bundled Triton server, in the foreground or in the background.

Library API:
- `TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, ...)`: a context manager around one
  server process (see trtspec.serve.server: loopback bind, admin key, drain on stop);
- `start_background(spec, ...)` / `stop_background(name)`: what `trtspec serve` / `serve --stop` do,
  with the state file `.trtspec/serve-<name>.json` (0600: it holds the admin key);
- `load_models(url, models, admin_key=...)` / `unload_models(url, models, admin_key=...)`: load / unload
  models of the repository of a running server (explicit model control; the key of its restricted
  model-repository API);
- `trtspec.serve.deploy.deploy_spec(...)`: `trtspec deploy` (stage, load beside the serving version,
  smoke test, switch, roll back).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trtspec.errors import ServeError
from trtspec.serve.server import (Endpoints, GrpcTls, TritonServer, admin_headers, clean_leftovers,
                                  drain_server, find_triton, free_port, is_our_server, pid_alive, proc_cmdline,
                                  remove_shm, stop_pid)
from trtspec.serve.state import read_state, state_dir, state_path, write_state
from trtspec.spec import Spec

__all__ = ["Endpoints", "GrpcTls", "TritonServer", "admin_key_for", "find_triton", "free_port", "load_models",
           "remove_shm", "repository_dir", "running_state", "server_for_spec", "start_background",
           "stop_background", "unload_models"]


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


def _http_client(url: str, admin_key: str | None = None):
    import tritonclient.http as httpclient

    from trtspec.client.remote import HeaderPlugin, normalize_url

    client = httpclient.InferenceServerClient(normalize_url(url))
    if admin_key:
        client.register_plugin(HeaderPlugin(admin_headers(admin_key, "http")))
    return client


_CONTROL_HINT = ("the server must run in explicit model-control mode, have the model in its repository, and be "
                 "given its admin key (admin_key=..., `--admin-key`, $TRTSPEC_ADMIN_KEY)")


def load_models(url: str, models: Iterable[str], *, reload: bool = False, admin_key: str | None = None) -> list[str]:
    """Load `models` from the model repository of the running server at `url` (HTTP HOST:PORT),
    which must run with `--model-control-mode=explicit` (as `TritonServer` does by default); its
    model-repository API takes `admin_key` (`TritonServer.admin_key`; default: the key of the
    `trtspec serve` server on that port). Loading an ensemble loads its steps too, so
    `load_models(url, ["ensemble"])` brings a whole deployment up. `reload` unloads a loaded model
    first (for new files with an unchanged config, which Triton's load would otherwise ignore).
    Returns the models now ready."""
    from tritonclient.utils import InferenceServerException

    client = _http_client(url, admin_key or admin_key_for(url))
    loaded = []
    try:
        for name in models:
            try:
                if reload and client.is_model_ready(name):
                    client.unload_model(name)
                client.load_model(name)
            except InferenceServerException as exc:
                raise ServeError(f"loading {name!r} into {url} failed: {exc.message()}", hint=_CONTROL_HINT) from None
            if not client.is_model_ready(name):
                raise ServeError(f"{name!r} is not ready on {url} after loading", hint="see the server log")
            loaded.append(name)
    finally:
        client.close()
    return loaded


def unload_models(url: str, models: Iterable[str], unload_dependents: bool = False,
                  admin_key: str | None = None) -> None:
    """Unload `models` from a running server (explicit mode, `admin_key` as in `load_models`); with
    `unload_dependents`, an ensemble's steps too (also when other ensembles use them)."""
    from tritonclient.utils import InferenceServerException

    client = _http_client(url, admin_key or admin_key_for(url))
    try:
        for name in models:
            try:
                client.unload_model(name, unload_dependents=unload_dependents)
            except InferenceServerException as exc:
                raise ServeError(f"unloading {name!r} from {url} failed: {exc.message()}", hint=_CONTROL_HINT) from None
    finally:
        client.close()
