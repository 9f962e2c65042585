"""Run the real Triton Inference Server bundled in the `nvidia-pytriton` wheel.

`TritonServer` is a context manager around one `tritonserver` process:

    with TritonServer("model_repository/demo") as server:
        print(server.grpc_url)          # "127.0.0.1:<port>"

One job each, beside this module:

- install.py: the bundled server, its Python-backend directory of links and its environment;
- endpoints.py: the bind address (127.0.0.1 unless `host=` says otherwise; the CLI warns) and free ports
  for every port given as 0;
- access.py: the admin key that guards the APIs which change the server (`admin_key`, or a random one per
  start: `server.admin_key`; `open_model_control=True` leaves them open), and gRPC TLS;
- drain.py: stopping lets the requests in flight finish (`drain_server`);
- processes.py: the process's identity, stopping it (SIGTERM, then SIGKILL of the process group after the
  exit timeout), and cleaning what a killed server left (stub processes holding its shm prefix,
  `/dev/shm/<prefix>*`).

A unique shared-memory prefix per server is removed from /dev/shm after it stops. A hard readiness deadline
holds: on failure the server is killed and the ServeError carries its log tail. The Python stubs exit by
themselves when the server dies (`trtspec.repository.serving.watch_server`).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trtspec.errors import ServeError
from trtspec.repository.server_flags import LOOPBACK, admin_headers, bind_args, restricted_args
from trtspec.repository.serving import CONTROL_DIR_ENV
from trtspec.serve.access import GrpcTls, check_admin_key, new_admin_key
from trtspec.serve.control import ModelControl
from trtspec.serve.drain import drain_server
from trtspec.serve.endpoints import Endpoints, check_host, connect_host, free_port, port_in_use
from trtspec.serve.install import find_triton, prepare_backends, server_env
from trtspec.serve.processes import (
    clean_leftovers,
    pid_alive,  # noqa: F401  (serve/deploy/preflight.py imports it from here)
    proc_start_time,
    stop_pid,
)


def _tail(path: Path | None, lines: int = 40) -> str:
    if path is None or not Path(path).is_file():
        return ""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 64 * 1024))
        text = f.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


# Error lines the bundled server prints on every CPU-only start (harmless).
_NOISE = ("CudaDriverHelper has not been initialized", "unable to create stream for", "pinned memory",
          "NVML", "DCGM")


def _errors(path: Path | None, limit: int = 10) -> list[str]:
    """The server log's error lines (Triton's `E` level), without the harmless CPU-only noise."""
    if path is None or not Path(path).is_file():
        return []
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    return [line for line in lines if line[:1] == "E" and not any(n in line for n in _NOISE)][-limit:]


class TritonServer:
    """One bundled `tritonserver` process serving `model_repository` (a context manager).

    Ports given as 0 are picked free; everything binds `host` (127.0.0.1 by default). `model_control`
    is "explicit" (default: the models in `load_models` are loaded at start, "*" = all; more can be
    loaded/unloaded later by a client holding `admin_key`) or "none" (everything in the repository,
    no runtime loading). `admin_key` guards the model-repository, shared-memory, trace and logging
    APIs (a random key when not given; `open_model_control=True` leaves them open). `grpc_tls` serves
    gRPC over TLS. `ready_timeout` bounds the wait for the server and every model to be ready; on
    failure the process is killed and the ServeError carries the end of the server log.
    `drain_timeout` is how long `stop` lets requests in flight finish (then they are cut with a
    final error); it is also Triton's `--exit-timeout-secs` unless `exit_timeout` is given.
    `work_dir` holds the backend links, the control dir and the log; a temp dir is made (and
    removed on stop) when none is given.
    """

    def __init__(
        self,
        model_repository: str | Path,
        *,
        http_port: int = 0,
        grpc_port: int = 0,
        metrics_port: int = 0,
        host: str = LOOPBACK,
        model_control: str = "explicit",
        load_models: Sequence[str] | None = ("*",),
        admin_key: str | None = None,
        open_model_control: bool = False,
        grpc_tls: GrpcTls | None = None,
        ready_timeout: float = 180.0,
        drain_timeout: float = 30.0,
        exit_timeout: int | None = None,
        log_verbose: int = 0,
        work_dir: str | Path | None = None,
        log_file: str | Path | None = None,
        shm_default_bytes: int = 4 << 20,
        shm_growth_bytes: int = 1 << 20,
        python_executable: str | None = None,
        triton_root: str | Path | None = None,
        env: dict[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ):
        self.model_repository = Path(model_repository).resolve()
        if model_control not in ("explicit", "none", "poll"):
            raise ServeError(f"unknown model control mode {model_control!r}", hint="use 'explicit' or 'none'")
        if drain_timeout < 0:
            raise ServeError(f"drain timeout must be >= 0 s, got {drain_timeout}")
        self.model_control = model_control
        self.load_models = list(load_models or [])
        self.host = check_host(host)
        self.open_model_control = open_model_control
        self.admin_key = None if open_model_control else check_admin_key(admin_key) if admin_key else new_admin_key()
        self.grpc_tls = grpc_tls
        self.ready_timeout = ready_timeout
        self.drain_timeout = float(drain_timeout)
        self.exit_timeout = int(exit_timeout) if exit_timeout is not None else max(5, math.ceil(drain_timeout))
        self.log_verbose = log_verbose
        self._ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        self._own_work_dir = work_dir is None
        self.work_dir = Path(work_dir).resolve() if work_dir is not None else None
        self._log_file = Path(log_file).resolve() if log_file is not None else None
        self.shm_default_bytes = shm_default_bytes
        self.shm_growth_bytes = shm_growth_bytes
        self.python_executable = python_executable
        self.triton_root = triton_root
        self.extra_env = dict(env or {})
        self.extra_args = list(extra_args)
        self.shm_prefix = f"trtspec_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        self.process: subprocess.Popen | None = None
        self.endpoints: Endpoints | None = None
        self.argv: list[str] | None = None
        self.start_time: int | None = None
        self.last_drain: dict[str, Any] | None = None

    # -- properties -------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path | None:
        return self._log_file

    @property
    def control_dir(self) -> Path | None:
        return self.work_dir / "control" if self.work_dir is not None else None

    @property
    def grpc_url(self) -> str:
        return self._require_endpoints().grpc_url

    @property
    def http_url(self) -> str:
        return self._require_endpoints().http_url

    @property
    def metrics_url(self) -> str:
        return self._require_endpoints().metrics_url

    def admin_headers(self, protocol: str = "http") -> dict[str, str]:
        """Headers for the restricted APIs of this server ({} when they are open)."""
        return admin_headers(self.admin_key, protocol)

    def _require_endpoints(self) -> Endpoints:
        if self.endpoints is None:
            raise ServeError("the server has not been started")
        return self.endpoints

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self._log_file, lines)

    def failure_report(self, lines: int = 25) -> str:
        """The log's error lines, then its last lines (what a failed start shows)."""
        errors = _errors(self._log_file)
        head = "errors:\n" + "\n".join(errors) + "\nlog tail:\n" if errors else "log tail:\n"
        return head + self.log_tail(lines)

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # -- start / stop -----------------------------------------------------------------------

    def command(self, backends_dir: Path) -> list[str]:
        ep = self._require_endpoints()
        argv = [
            str(find_triton(self.triton_root).binary),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backends_dir}",
            f"--backend-config=python,shm-default-byte-size={self.shm_default_bytes}",
            f"--backend-config=python,shm-growth-byte-size={self.shm_growth_bytes}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            *bind_args(self.host),
            f"--http-port={ep.http_port}", f"--grpc-port={ep.grpc_port}", f"--metrics-port={ep.metrics_port}",
            "--allow-gpu-metrics=false",
            f"--exit-timeout-secs={self.exit_timeout}",
            f"--log-verbose={self.log_verbose}",
            f"--model-control-mode={self.model_control}",
        ]
        if self.admin_key:
            argv += restricted_args(self.admin_key)
        if self.grpc_tls is not None:
            argv += self.grpc_tls.args()
        if self.model_control == "explicit":
            argv += [f"--load-model={name}" for name in self.load_models]
        return argv + self.extra_args

    def _pick_ports(self) -> Endpoints:
        chosen: dict[str, int] = {}
        for key, port in self._ports.items():
            if port:
                if port_in_use(port, connect_host(self.host)):
                    raise ServeError(f"{key} port {port} is already in use",
                                     hint=f"stop what listens on {port} or pass --{key}-port 0 for a free port")
                chosen[key] = port
        for key, port in self._ports.items():
            if not port:
                chosen[key] = free_port(exclude=chosen.values())
        return Endpoints(connect_host(self.host), chosen["http"], chosen["grpc"], chosen["metrics"],
                         bind=self.host, grpc_tls=self.grpc_tls is not None)

    def start(self, wait: bool = True) -> TritonServer:
        """Start the process (and, with `wait`, block until it and its models are ready).

        The server leads its own session, so it outlives this process if it is not stopped (the
        CLI's background mode, stopped later with `stop_background`)."""
        if self.is_running():
            return self
        if not self.model_repository.is_dir():
            raise ServeError(f"model repository not found: {self.model_repository}",
                             hint="run `trtspec build` first, or pass the repository path")
        install = find_triton(self.triton_root)
        if self.work_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="trtspec-triton-"))
        self.work_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        backends = prepare_backends(install, self.work_dir / "backends")
        control = self.control_dir
        shutil.rmtree(control, ignore_errors=True)  # no drain request of a previous run
        control.mkdir(mode=0o700)
        if self._log_file is None:
            self._log_file = self.work_dir / "tritonserver.log"
        self.endpoints = self._pick_ports()
        env = server_env(python_executable=self.python_executable)
        env.update(self.extra_env)
        env[CONTROL_DIR_ENV] = str(control)
        argv = self.command(backends)
        self._log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self._log_file, "ab") as log:
            log.write(("# " + " ".join(_redact(argv, self.admin_key)) + "\n").encode())
            log.flush()
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, cwd=str(self.work_dir), start_new_session=True)
        self.argv, self.start_time = argv, proc_start_time(self.process.pid)
        if wait:
            try:
                self.wait_ready(self.ready_timeout)
            except BaseException:
                self.stop(grace=2.0, drain=False)
                raise
        return self

    def wait_ready(self, timeout: float | None = None, models: Iterable[str] = ()) -> None:
        """Block until the server (and each of `models`) is ready; ServeError with the log tail if not."""
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        pending: list[str | None] = [None, *models]  # None: the server itself
        with ModelControl(self._require_endpoints().http_url, timeout=1.0) as health:  # (health needs no key)
            while pending:
                if self.process is not None and self.process.poll() is not None:
                    raise ServeError(
                        f"tritonserver exited with code {self.process.returncode} while starting; "
                        f"{self.failure_report()}",
                        hint=f"full log: {self._log_file}")
                if health.server_ready() if pending[0] is None else health.model_ready(pending[0]):
                    pending.pop(0)
                    continue
                if time.monotonic() > deadline:
                    what = "/v2/health/ready" if pending[0] is None else f"/v2/models/{pending[0]}/ready"
                    raise ServeError(
                        f"tritonserver not ready after {timeout or self.ready_timeout:.0f}s ({what}); "
                        f"{self.failure_report()}",
                        hint=f"full log: {self._log_file}; a model stuck in loading often means a Python/stub "
                             "mismatch")
                time.sleep(0.1)

    def drain(self, timeout: float | None = None) -> dict[str, Any] | None:
        """Let the requests in flight finish (see `drain_server`); None when the server is not running."""
        if not self.is_running() or self.endpoints is None or self.control_dir is None:
            return None
        self.last_drain = drain_server(self.http_url, self.control_dir,
                                       self.drain_timeout if timeout is None else timeout,
                                       admin_key=self.admin_key, explicit=self.model_control == "explicit",
                                       alive=self.is_running)
        return self.last_drain

    def stop(self, grace: float | None = None, drain: bool = True) -> int | None:
        """Drain (unless `drain=False`), SIGTERM, wait `grace` seconds (default exit_timeout + 5), then
        SIGKILL the process group.

        Removes the shared-memory regions and stub processes of this server and, if it made it, the
        work dir (the log is kept when the server failed, so the path in the error still works)."""
        code = None
        if self.process is not None:
            if drain:
                self.drain()
            code = stop_pid(self.process.pid, grace=self.exit_timeout + 5 if grace is None else grace,
                            process=self.process)
        clean_leftovers(self.shm_prefix)
        if self.control_dir is not None:
            shutil.rmtree(self.control_dir, ignore_errors=True)
        if self._own_work_dir and self.work_dir is not None and code in (0, None):
            shutil.rmtree(self.work_dir, ignore_errors=True)
        return code

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def restart(self) -> TritonServer:
        """Stop and start again on the same ports (clean restart)."""
        self.stop()
        self._ports = {"http": self.endpoints.http_port, "grpc": self.endpoints.grpc_port,
                       "metrics": self.endpoints.metrics_port} if self.endpoints else self._ports
        self.process = None
        deadline = time.monotonic() + 10
        while any(port_in_use(p, connect_host(self.host)) for p in self._ports.values() if p) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._own_work_dir:
            self.work_dir = None
            self._log_file = None
        self.shm_prefix = f"trtspec_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        return self.start()

    def state(self) -> dict[str, Any]:
        """What `trtspec serve` records in its state file (kept 0600: it holds the admin key)."""
        ep = self._require_endpoints()
        return {"pid": self.pid, "start_time": self.start_time, "cmdline": self.argv,
                "model_repository": str(self.model_repository), "log": str(self._log_file),
                "shm_prefix": self.shm_prefix, "work_dir": str(self.work_dir),
                "control_dir": str(self.control_dir), "model_control": self.model_control,
                "admin_key": self.admin_key, "model_control_open": self.open_model_control,
                "drain_timeout": self.drain_timeout, "exit_timeout": self.exit_timeout, **ep.to_dict()}


def _redact(argv: Sequence[str], key: str | None) -> list[str]:
    return [a.replace(key, "***") for a in argv] if key else list(argv)

