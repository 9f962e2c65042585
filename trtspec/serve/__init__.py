"""Serving a built deployment on the bundled Triton server, in the foreground or in the background.

Library API:
- `TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, ...)`: a context manager around one
  server process (see trtspec.serve.server);
- `start_background(spec, ...)` / `stop_background(name)`: what `trtspec serve` / `serve --stop` do,
  with the state file `.trtspec/serve-<name>.json`;
- `deploy(url, repository, models)`: load (or reload) models of a repository dir into a running
  server started with `--model-control-mode=explicit`; `undeploy(url, models)` unloads them.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trtspec.errors import ServeError
from trtspec.serve.server import Endpoints, TritonServer, find_triton, free_port, remove_shm, stop_pid
from trtspec.serve.state import read_state, state_dir, state_path
from trtspec.spec import Spec

__all__ = ["Endpoints", "TritonServer", "deploy", "find_triton", "free_port", "repository_dir", "running_state",
           "server_for_spec", "start_background", "stop_background", "undeploy"]


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
    if not state or not state.get("pid"):
        return None
    try:
        import os

        os.kill(int(state["pid"]), 0)
    except (ProcessLookupError, ValueError):
        return None
    except PermissionError:  # pragma: no cover
        pass
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


def deploy(url: str, repository: str | Path, models: Iterable[str] | None = None) -> list[str]:
    """Load `models` (default: every model dir) of a local repository dir into the running server at
    `url` (HTTP HOST:PORT), sending each config and `1/model.py`: the server need not see the dir.
    The server must run with `--model-control-mode=explicit` and see the engine dirs at the same
    paths (a relative `engine_dir` is sent resolved against `repository`). Dependencies are loaded first (the
    ensemble last). Returns the models loaded."""
    from tritonclient.utils import InferenceServerException

    from trtspec.repository import pbtxt

    repository = Path(repository)
    dirs = [p for p in sorted(repository.iterdir()) if (p / "config.pbtxt").is_file()]
    if models is not None:
        wanted = set(models)
        dirs = [p for p in dirs if p.name in wanted]
    dirs.sort(key=lambda p: pbtxt.read_config(p / "config.pbtxt").platform == "ensemble")
    client = _http_client(url)
    loaded = []
    try:
        for model_dir in dirs:
            config = pbtxt.read_config(model_dir / "config.pbtxt")
            if "engine_dir" in config.parameters:  # relative to this repository, not to the server's copy
                engine_dir = Path(config.parameters["engine_dir"].string_value)
                if not engine_dir.is_absolute():
                    config.parameters["engine_dir"].string_value = str((repository / engine_dir).resolve())
            files = {f"file:{p.relative_to(model_dir).as_posix()}": p.read_bytes()
                     for p in sorted(model_dir.rglob("*")) if p.is_file() and p.name != "config.pbtxt"
                     and "__pycache__" not in p.parts}
            try:
                if client.is_model_ready(config.name):
                    client.unload_model(config.name)  # a reload with the same config would be a no-op
                client.load_model(config.name, config=pbtxt.to_json(config), files=files or None)
            except InferenceServerException as exc:
                raise ServeError(f"loading {config.name!r} into {url} failed: {exc.message()}",
                                 hint="see the server log; the server must run in explicit model-control mode")
            loaded.append(config.name)
    finally:
        client.close()
    return loaded


def undeploy(url: str, models: Iterable[str]) -> None:
    from tritonclient.utils import InferenceServerException

    client = _http_client(url)
    try:
        for name in models:
            try:
                client.unload_model(name, unload_dependents=True)
            except InferenceServerException as exc:
                raise ServeError(f"unloading {name!r} from {url} failed: {exc.message()}") from None
    finally:
        client.close()
