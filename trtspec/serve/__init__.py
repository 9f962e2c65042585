"""Serving a built deployment: one interface, `Server`, for every Triton server trtspec runs.

A deployment's backend (trtspec.backends) makes its server from the spec and `ServeOptions`:
- `BundledServer` (serve/bundled.py): the `tritonserver` bundled in the nvidia-pytriton wheel
  (`TritonServer`, serve/server.py: loopback bind, admin key, drain on stop), in the background with
  the state file `.trtspec/serve-<name>.json` (serve/background.py, trtspec.state) or in this terminal;
- `ContainerServer` (serve/container.py): the Triton TensorRT-LLM container's `tritonserver` (under
  mpirun for trtllm-engine), in the foreground, its command printable.

Library API besides:
- `TritonServer(repo, http_port=0, grpc_port=0, metrics_port=0, ...)`: a context manager around one
  bundled server process;
- `start_background(spec, ...)` / `stop_background(name)`: what `trtspec serve` / `serve --stop` do;
- `ModelControl` and `load_models(url, models, admin_key=...)` / `unload_models(...)` (serve/control.py):
  the one model-control client (explicit model control; the key of the restricted model-repository API);
- `trtspec.serve.deploy.deploy_spec(...)`: `trtspec deploy` (stage, load beside the serving version,
  smoke test, switch, roll back; its state beside the server repository, in DIR.trtspec/).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from trtspec.repository.server_flags import LOOPBACK
from trtspec.serve.access import GrpcTls
from trtspec.serve.background import (
    admin_key_for,
    repository_dir,
    running_state,
    server_for_spec,
    start_background,
    stop_background,
)
from trtspec.serve.control import ModelControl, load_models, unload_models
from trtspec.serve.endpoints import Endpoints, free_port
from trtspec.serve.install import find_triton
from trtspec.serve.processes import remove_shm
from trtspec.serve.server import TritonServer

__all__ = ["Endpoints", "GrpcTls", "ModelControl", "Server", "ServeOptions", "TritonServer", "admin_key_for",
           "find_triton", "free_port", "load_models", "remove_shm", "repository_dir", "running_state",
           "server_for_spec", "start_background", "stop_background", "unload_models"]


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """How `trtspec serve` runs a deployment's server. Ports: None = the spec's serving.*, 0 = a free one."""

    out_repo: Path = Path("model_repository")  # parent of the built model_repository/<name>/
    http_port: int | None = None
    grpc_port: int | None = None
    metrics_port: int | None = None
    host: str = LOOPBACK
    admin_key: str | None = None               # None: a random key per start
    open_model_control: bool = False
    drain_timeout: float = 30.0
    grpc_tls: GrpcTls | None = None
    ready_timeout: float = 300.0


class Server(Protocol):
    """A Triton server trtspec runs for one deployment."""

    detaches: bool  # it can run in the background (state file, `serve --stop`); else in this terminal only

    def command(self) -> dict[str, Any]:
        """{"argv", "shell"}: what it runs, without secrets (a server of this terminal only)."""

    def start_background(self) -> dict[str, Any]:
        """Start it detached; its recorded state (endpoints, pid, log)."""

    def run(self, echo: Callable[..., None], as_json: bool = False) -> int:
        """Serve in this terminal until stopped (Ctrl-C, SIGTERM) or the server exits; the exit code.
        What it says goes through `echo(text, err=False)` (click.echo's signature)."""
