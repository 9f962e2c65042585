"""Run the real Triton Inference Server bundled in the `nvidia-pytriton` wheel.

`TritonServer` is a context manager around one `tritonserver` process:

    with TritonServer("model_repository/demo") as server:
        print(server.grpc_url)          # "localhost:<port>"

It prepares what the bundled server needs to run Python-backend models on this machine
(see shared/reference/triton-on-cpu.md):

- a backend directory `<work>/backends/python/` of symlinks to the wheel's `libtriton_python.so`,
  `triton_python_backend_utils.py` and the stub built for the running Python (symlinks keep the
  wheel's `$ORIGIN` RPATHs working; a stub beside the model is not found);
- `LD_LIBRARY_PATH` starting with this Python's `LIBDIR` (else the stub binds no libpython and the
  server hangs in "loading" forever) and `PATH` starting with the virtualenv's `bin` (the stub's
  embedded Python finds the venv's site-packages through `python3` on PATH);
- a unique shared-memory prefix per server, removed from /dev/shm after it stops;
- free ports for every port given as 0;
- a hard readiness deadline: on failure the server is killed and the ServeError carries its log tail;
- shutdown with SIGTERM, then SIGKILL of its process group after a grace period.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trtspec.errors import ServeError

_SHM_DIR = Path("/dev/shm")


# --------------------------------------------------------------------------------------------
# Locating the bundled server
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TritonInstall:
    """Paths of the server binary and Python backend inside the installed pytriton wheel."""

    root: Path

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    def stub(self, python_version: str) -> Path:
        return self.root / "python_backend_stubs" / python_version / "triton_python_backend_stub"


def find_triton(root: str | Path | None = None) -> TritonInstall:
    """The bundled server (or `root`, a `tritonserver` tree laid out like pytriton's)."""
    if root is None:
        root = os.environ.get("TRTSPEC_TRITON_ROOT")
    if root is None:
        try:
            import pytriton  # noqa: F401  (only to find the wheel)
        except ImportError:
            raise ServeError("the bundled Triton server is not installed (package nvidia-pytriton)",
                             hint="pip install 'nvidia-pytriton>=0.5' (Linux x86_64), or set TRTSPEC_TRITON_ROOT "
                                  "to a tritonserver tree") from None
        root = Path(pytriton.__file__).parent / "tritonserver"
    install = TritonInstall(Path(root))
    if not install.binary.is_file():
        raise ServeError(f"no tritonserver binary at {install.binary}",
                         hint="reinstall nvidia-pytriton or fix TRTSPEC_TRITON_ROOT")
    return install


def prepare_backends(install: TritonInstall, backends_dir: Path, python_version: str | None = None) -> Path:
    """Fill `backends_dir/python/` with symlinks to the Python backend and the matching stub."""
    version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = install.stub(version)
    if not stub.is_file():
        have = sorted(p.name for p in (install.root / "python_backend_stubs").glob("*"))
        raise ServeError(f"the bundled Triton has no Python backend stub for Python {version}",
                         hint=f"run trtspec with one of Python {', '.join(have) or '(none)'}")
    python_dir = Path(backends_dir) / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    links = {
        "libtriton_python.so": install.python_backend / "libtriton_python.so",
        "triton_python_backend_utils.py": install.python_backend / "triton_python_backend_utils.py",
        "triton_python_backend_stub": stub,
    }
    for name, source in links.items():
        link = python_dir / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and Path(os.readlink(link)) == source:
                continue
            link.unlink()
        link.symlink_to(source)
    return Path(backends_dir)


def server_env(base: dict[str, str] | None = None, python_executable: str | None = None) -> dict[str, str]:
    """Environment for the server: this Python's LIBDIR first on LD_LIBRARY_PATH, its bin first on PATH."""
    env = dict(os.environ if base is None else base)
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    ld = [p for p in (libdir, env.get("LD_LIBRARY_PATH", "")) if p]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(ld)
    bindir = str(Path(python_executable or sys.executable).parent)
    env["PATH"] = os.pathsep.join([bindir, env.get("PATH", "")]) if env.get("PATH") else bindir
    env.setdefault("TRANSFORMERS_VERBOSITY", "error")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def free_port(exclude: Iterable[int] = ()) -> int:
    """A TCP port nobody listens on now (the kernel's pick), not in `exclude`."""
    exclude = set(exclude)
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if port not in exclude:
            return port
    raise ServeError("could not find a free TCP port")  # pragma: no cover


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def remove_shm(prefix: str) -> list[str]:
    """Delete `/dev/shm/<prefix>*` (left behind when a server is killed); returns what was removed."""
    if not prefix:
        return []
    removed = []
    for path in glob.glob(str(_SHM_DIR / f"{glob.escape(prefix)}*")):
        with contextlib.suppress(OSError):
            os.unlink(path)
            removed.append(path)
    return removed


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


def _http_status(url: str, timeout: float = 1.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (localhost only)
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, TimeoutError):
        return None


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Endpoints:
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "http_url": self.http_url, "grpc_url": self.grpc_url,
                "metrics_url": self.metrics_url}


class TritonServer:
    """One bundled `tritonserver` process serving `model_repository` (a context manager).

    Ports given as 0 are picked free. `model_control` is "explicit" (default: the models in
    `load_models` are loaded at start, "*" = all; more can be loaded/unloaded later) or "none"
    (everything in the repository, no runtime loading). `ready_timeout` bounds the wait for the
    server and every model to be ready; on failure the process is killed and the ServeError
    carries the end of the server log. `work_dir` holds the backend links and the log; a temp dir
    is made (and removed on stop) when none is given.
    """

    def __init__(
        self,
        model_repository: str | Path,
        *,
        http_port: int = 0,
        grpc_port: int = 0,
        metrics_port: int = 0,
        host: str = "localhost",
        model_control: str = "explicit",
        load_models: Sequence[str] | None = ("*",),
        ready_timeout: float = 180.0,
        exit_timeout: int = 10,
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
        self.model_control = model_control
        self.load_models = list(load_models or [])
        self.ready_timeout = ready_timeout
        self.exit_timeout = exit_timeout
        self.log_verbose = log_verbose
        self.host = host
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

    # -- properties -------------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def log_path(self) -> Path | None:
        return self._log_file

    @property
    def grpc_url(self) -> str:
        return self._require_endpoints().grpc_url

    @property
    def http_url(self) -> str:
        return self._require_endpoints().http_url

    @property
    def metrics_url(self) -> str:
        return self._require_endpoints().metrics_url

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
            f"--http-port={ep.http_port}", f"--grpc-port={ep.grpc_port}", f"--metrics-port={ep.metrics_port}",
            "--allow-gpu-metrics=false",
            f"--exit-timeout-secs={self.exit_timeout}",
            f"--log-verbose={self.log_verbose}",
            f"--model-control-mode={self.model_control}",
        ]
        if self.model_control == "explicit":
            argv += [f"--load-model={name}" for name in self.load_models]
        return argv + self.extra_args

    def _pick_ports(self) -> Endpoints:
        chosen: dict[str, int] = {}
        for key, port in self._ports.items():
            if port:
                if port_in_use(port):
                    raise ServeError(f"{key} port {port} is already in use",
                                     hint=f"stop what listens on {port} or pass --{key}-port 0 for a free port")
                chosen[key] = port
        for key, port in self._ports.items():
            if not port:
                chosen[key] = free_port(exclude=chosen.values())
        return Endpoints(self.host, chosen["http"], chosen["grpc"], chosen["metrics"])

    def start(self, wait: bool = True) -> TritonServer:
        """Start the process (and, with `wait`, block until it and its models are ready).

        The server leads its own session, so it outlives this process if it is not stopped (the
        CLI's background mode, stopped later with `stop_pid`)."""
        if self.is_running():
            return self
        if not self.model_repository.is_dir():
            raise ServeError(f"model repository not found: {self.model_repository}",
                             hint="run `trtspec build` first, or pass the repository path")
        install = find_triton(self.triton_root)
        if self.work_dir is None:
            self.work_dir = Path(tempfile.mkdtemp(prefix="trtspec-triton-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        backends = prepare_backends(install, self.work_dir / "backends")
        if self._log_file is None:
            self._log_file = self.work_dir / "tritonserver.log"
        self.endpoints = self._pick_ports()
        env = server_env(python_executable=self.python_executable)
        env.update(self.extra_env)
        argv = self.command(backends)
        self._log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self._log_file, "ab") as log:
            log.write(("# " + " ".join(argv) + "\n").encode())
            log.flush()
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, cwd=str(self.work_dir), start_new_session=True)
        if wait:
            try:
                self.wait_ready(self.ready_timeout)
            except BaseException:
                self.stop(grace=2.0)
                raise
        return self

    def wait_ready(self, timeout: float | None = None, models: Iterable[str] = ()) -> None:
        """Block until the server (and each of `models`) is ready; ServeError with the log tail if not."""
        deadline = time.monotonic() + (self.ready_timeout if timeout is None else timeout)
        ep = self._require_endpoints()
        base = f"http://{ep.host}:{ep.http_port}"
        pending = [f"{base}/v2/health/ready"] + [f"{base}/v2/models/{m}/ready" for m in models]
        while pending:
            if self.process is not None and self.process.poll() is not None:
                raise ServeError(
                    f"tritonserver exited with code {self.process.returncode} while starting; "
                    f"{self.failure_report()}",
                    hint=f"full log: {self._log_file}")
            if _http_status(pending[0]) == 200:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                what = pending[0].removeprefix(base)
                raise ServeError(
                    f"tritonserver not ready after {timeout or self.ready_timeout:.0f}s ({what}); "
                    f"{self.failure_report()}",
                    hint=f"full log: {self._log_file}; a model stuck in loading often means a Python/stub mismatch")
            time.sleep(0.1)

    def stop(self, grace: float | None = None) -> int | None:
        """SIGTERM, wait `grace` seconds (default exit_timeout + 5), then SIGKILL the process group.

        Removes the shared-memory regions of this server and, if it made it, the work dir
        (the log is kept when the server failed, so the path in the error still works)."""
        code = None
        if self.process is not None:
            code = stop_pid(self.process.pid, grace=self.exit_timeout + 5 if grace is None else grace,
                            process=self.process)
        remove_shm(self.shm_prefix)
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
        while any(port_in_use(p) for p in self._ports.values() if p) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._own_work_dir:
            self.work_dir = None
            self._log_file = None
        self.shm_prefix = f"trtspec_{os.getpid()}_{uuid.uuid4().hex[:8]}_"
        return self.start()

    # -- explicit model control (deploy on a running server) -----------------------------------

    def state(self) -> dict[str, Any]:
        """What `trtspec serve` records in its pid file."""
        ep = self._require_endpoints()
        return {"pid": self.pid, "model_repository": str(self.model_repository), "log": str(self._log_file),
                "shm_prefix": self.shm_prefix, "work_dir": str(self.work_dir),
                "model_control": self.model_control, **ep.to_dict()}


def pid_alive(pid: int) -> bool:
    try:  # our own child (started by this process) is reaped here, so it does not linger as a zombie
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # pragma: no cover - someone else's process
        return True
    return True


def stop_pid(pid: int, grace: float = 15.0, process: subprocess.Popen | None = None) -> int | None:
    """Stop a server by pid: SIGTERM, wait up to `grace` s, then SIGKILL its process group
    (the server and its Python-backend stubs). Returns the exit code when it is our child."""

    def gone() -> bool:
        if process is not None:
            return process.poll() is not None
        return not pid_alive(pid)

    if gone():
        return process.returncode if process is not None else None
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not gone():
        time.sleep(0.05)
    if not gone():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)  # the server leads its own session (start_new_session)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        end = time.monotonic() + 5
        while time.monotonic() < end and not gone():
            time.sleep(0.05)
    if process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=1)
        return process.returncode
    return None
