"""The bundled server as a deployment's server (trtspec.serve.Server): the `tritonserver` of the
nvidia-pytriton wheel on `model_repository/<name>/`, in the background (`start_background`, the state
file, `serve --stop`) or in this terminal until Ctrl-C / SIGTERM, then drained and stopped (`run`)."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable
from typing import Any

from trtspec.errors import ServeError
from trtspec.serve.background import running_state, server_for_spec, start_background
from trtspec.spec import Spec

PRIVATE = ("admin_key", "cmdline")  # never printed


def public(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k not in PRIVATE}


def endpoint_lines(state: dict[str, Any], where: str = "the key is in the state file") -> list[str]:
    grpc = ("grpcs://" if state.get("grpc_tls") else "") + state["grpc_url"]
    control = ("OPEN (--open-model-control)" if state.get("model_control_open")
               else f"restricted to the admin key (header trtspec-admin-key; {where})")
    return [f"  gRPC     {grpc}   (trtspec generate --url {grpc})",
            f"  HTTP     http://{state['http_url']}/v2/models/{state.get('ensemble', 'ensemble')}/generate",
            f"  metrics  {state['metrics_url']}",
            f"  models   {state.get('model_control', 'explicit')} control, {control}",
            f"  log      {state['log']}"]


class BundledServer:
    """`serve_kwargs` are TritonServer's (ports, host, admin_key, open_model_control, drain_timeout,
    grpc_tls, ready_timeout) plus `out_repo`, the parent of the built repository."""

    detaches = True

    def __init__(self, spec: Spec, **serve_kwargs: Any):
        self.spec = spec
        self.kwargs = serve_kwargs

    def command(self) -> dict[str, Any]:
        raise ServeError("the bundled server's command line is made at start (free ports, backend links)",
                         hint="run `trtspec serve`; the command is the first line of its log")

    def start_background(self) -> dict[str, Any]:
        return start_background(self.spec, **self.kwargs)

    def run(self, echo: Callable[..., None], as_json: bool = False) -> int:
        """Serve in this terminal; SIGTERM or Ctrl-C drain and stop it. A server that exits by itself is a
        ServeError with its log's errors."""
        spec = self.spec
        if running_state(spec.name):
            raise ServeError(f"a background server for {spec.name!r} is running",
                             hint=f"stop it with `trtspec serve -c {spec.source or 'SPEC'} --stop` first")
        server = server_for_spec(spec, **self.kwargs)
        stop_event = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
        try:
            server.start()
            state = server.state() | {"name": spec.name, "ensemble": spec.serving.ensemble_name}
            if as_json:
                echo(json.dumps(public(state), indent=2))
            else:
                echo(f"serving {spec.name!r} ({spec.method}), pid {server.pid}; Ctrl-C stops it")
                where = ("the --admin-key given" if self.kwargs.get("admin_key")
                         else "a random key: pass --admin-key to choose one")
                for line in endpoint_lines(state, where):
                    echo(line)
            while not stop_event.wait(0.5):
                if not server.is_running():
                    raise ServeError(f"tritonserver exited; {server.failure_report()}",
                                     hint=f"full log: {server.log_path}")
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            echo(f"draining (up to {server.drain_timeout:g}s) and stopping ...", err=True)
            server.stop()
        return 0
