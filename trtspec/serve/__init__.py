"""Serving a built deployment on the bundled Triton server, in the foreground or in the background.

Library API:
- `TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, ...)`: a context manager around one
  server process (see trtspec.serve.server);
- `start_background(spec, ...)` / `stop_background(name)`: what `trtspec serve` / `serve --stop` do,
  with the state file `.trtspec/serve-<name>.json`;
- `load_models(url, models)` / `unload_models(url, models)`: load / unload models of the repository of a
  running server started with `--model-control-mode=explicit`;
- `trtspec.serve.deploy.deploy_spec(...)`: `trtspec deploy` (stage, load, smoke test, roll back).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trtspec.errors import ServeError
from trtspec.serve.server import Endpoints, TritonServer, find_triton, free_port, pid_alive, remove_shm, stop_pid
from trtspec.serve.state import read_state, state_dir, state_path
from trtspec.spec import Spec

__all__ = ["Endpoints", "TritonServer", "load_models", "find_triton", "free_port", "repository_dir", "running_state",
           "server_for_spec", "start_background", "stop_background", "unload_models"]


def repository_dir(spec: Spec, out_repo: str | Path = "model_repository") -> Path:
    path = Path(out_repo) / spec.name
    if not (path / spec.serving.ensemble_name / "config.pbtxt").is_file():
        raise ServeError(f"no model repository for {spec.name!r} at {path}",
                         hint=f"run `trtspec build -c {spec.source or 'SPEC'}` first")
    return path


def server_for_spec(spec: Spec, *, out_repo: str | Path = "model_repository", http_port: int | None = None,
                    grpc_port: int | None = None, metrics_port: int | None = None, **kwargs: Any) -> TritonServer:
    """A TritonServer for the spec's built repository; ports default to the spec's serving.* (0 = free)."""
    s = spec.serving
    return TritonServer(repository_dir(spec, out_repo),
                        http_port=s.http_port if http_port is None else http_port,
                        grpc_port=s.grpc_port if grpc_port is None else grpc_port,
                        metrics_port=s.metrics_port if metrics_port is None else metrics_port, **kwargs)


def running_state(name: str) -> dict[str, Any] | None:
    """The recorded background server of deployment `name`, if its process is alive."""
    state = read_state(state_path(name))
    if not state or not isinstance(state.get("pid"), int) or not pid_alive(state["pid"]):
        return None
    return state


def start_background(spec: Spec, **kwargs: Any) -> dict[str, Any]:
    """Start the server detached (it outlives this process); record and return its state."""
    if running_state(spec.name):
        state = running_state(spec.name)
        raise ServeError(f"a server for {spec.name!r} is already running (pid {state['pid']}, gRPC {state['grpc_url']})",
                         hint="stop it with `trtspec serve --stop`")
    work = state_dir() / f"serve-{spec.name}"
    if work.exists():
        shutil.rmtree(work, ignore_errors=True)
    server = server_for_spec(spec, work_dir=work, **kwargs)
    server.start(wait=False)
    try:
        server.wait_ready()
    except BaseException:
        server.stop(grace=2.0)
        raise
    state = server.state() | {"name": spec.name, "ensemble": spec.serving.ensemble_name}
    path = state_path(spec.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    return state


def stop_background(name: str, grace: float = 20.0) -> dict[str, Any] | None:
    """Stop the recorded background server of `name` (None if none was recorded)."""
    path = state_path(name)
    state = read_state(path)
    if state is None:
        return None
    if state.get("pid"):
        stop_pid(int(state["pid"]), grace=grace)
    remove_shm(state.get("shm_prefix", ""))
    path.unlink(missing_ok=True)
    return state


def _http_client(url: str):
    import tritonclient.http as httpclient

    from trtspec.client.remote import normalize_url

    return httpclient.InferenceServerClient(normalize_url(url))


def load_models(url: str, models: Iterable[str], *, reload: bool = False) -> list[str]:
    """Load `models` from the model repository of the running server at `url` (HTTP HOST:PORT),
    which must run with `--model-control-mode=explicit` (as `TritonServer` does by default).
    Loading an ensemble loads its steps too, so `load_models(url, ["ensemble"])` brings a whole
    deployment up. `reload` unloads a loaded model first (for new files with an unchanged config,
    which Triton's load would otherwise ignore). Returns the models now ready."""
    from tritonclient.utils import InferenceServerException

    client = _http_client(url)
    loaded = []
    try:
        for name in models:
            try:
                if reload and client.is_model_ready(name):
                    client.unload_model(name)
                client.load_model(name)
            except InferenceServerException as exc:
                raise ServeError(f"loading {name!r} into {url} failed: {exc.message()}",
                                 hint="see the server log; the server must run in explicit model-control mode "
                                      "and have the model in its repository") from None
            if not client.is_model_ready(name):
                raise ServeError(f"{name!r} is not ready on {url} after loading", hint="see the server log")
            loaded.append(name)
    finally:
        client.close()
    return loaded


def unload_models(url: str, models: Iterable[str], unload_dependents: bool = False) -> None:
    """Unload `models` from a running server (explicit mode); with `unload_dependents`, an
    ensemble's steps too (also when other ensembles use them)."""
    from tritonclient.utils import InferenceServerException

    client = _http_client(url)
    try:
        for name in models:
            try:
                client.unload_model(name, unload_dependents=unload_dependents)
            except InferenceServerException as exc:
                raise ServeError(f"unloading {name!r} from {url} failed: {exc.message()}") from None
    finally:
        client.close()
