"""Run the real Triton Inference Server bundled in the `nvidia-pytriton` wheel.

`TritonServer` is a context manager around one `tritonserver` process:

    with TritonServer("model_repository/demo") as server:
        print(server.grpc_url)          # "127.0.0.1:<port>"

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
- a hard readiness deadline: on failure the server is killed and the ServeError carries its log tail.

Safe by default:

- HTTP, gRPC and metrics bind 127.0.0.1 (`host=` binds elsewhere; the CLI warns);
- the APIs that change the server (model-repository: load/unload, which runs the `model.py` a client
  uploads; shared-memory, trace and logging, which open files and regions by name) are restricted to
  requests carrying the header `trtspec-admin-key` (gRPC: `triton-grpc-protocol-trtspec-admin-key`, the
  form Triton expects). The key is `admin_key`, or a random one per start (`server.admin_key`);
  `open_model_control=True` leaves them open. Health, metadata, model config, statistics and inference
  stay open. The key is on the server's command line, so local users who can read /proc see it;
  against other hosts and web pages (which cannot add the header) it holds.

Stopping drains (`drain_server`): Triton's own SIGTERM path cannot finish a streamed *ensemble*
request (it stops the step models' schedulers first, the next step's internal request fails to
enqueue and the ensemble never completes; its clients hang until the exit timeout). So before the
SIGTERM trtspec closes the front door itself (unloads the ensembles, whose requests in flight still
complete), writes `<work>/control/drain.json` with a deadline that the generation models read (they
cut what still runs at the deadline with a final "shutdown" error), and waits for both; then SIGTERM,
then SIGKILL of the process group after the exit timeout. The Python stubs exit by themselves when the
server dies (`trtspec.repository.serving.watch_server`), and `clean_leftovers` removes what a killed
server left (stub processes holding its shm prefix, `/dev/shm/<prefix>*`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import ipaddress
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trtspec.errors import ServeError
from trtspec.repository.server_flags import (ADMIN_HEADER, ADMIN_KEY_ENV, GRPC_ADMIN_HEADER,  # noqa: F401
                                             LOOPBACK, RESTRICTED_APIS, admin_headers, bind_args, restricted_args)
from trtspec.repository.serving import CONTROL_DIR_ENV, DRAIN_FILE
from trtspec.serve.control import ModelControl

_SHM_DIR = Path("/dev/shm")

DRAIN_MARGIN = 5.0                                       # seconds past the drain deadline for the last responses
_KEY_RE = re.compile(r"[A-Za-z0-9._~-]{16,256}")
_PREFIX_RE = re.compile(r"trtspec_\d+_[0-9a-f]{8}_")


# --------------------------------------------------------------------------------------------
# Bind addresses and the admin key
# --------------------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def connect_host(bind: str) -> str:
    """Where a client on this machine reaches a server bound to `bind` (the IPv4 wildcard -> 127.0.0.1, the IPv6
    one -> ::1)."""
    try:
        address = ipaddress.ip_address(bind) if bind else None
    except ValueError:
        return bind
    if address is None or address.is_unspecified:
        return "::1" if address is not None and address.version == 6 else LOOPBACK
    return bind


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def check_host(host: str) -> str:
    """A bind address: an IP literal or a host name (no ports, schemes or spaces)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", host):
        raise ServeError(f"bad bind address {host!r}", hint="pass an IP address (127.0.0.1, 0.0.0.0, ::1) or a host name")
    return host


def new_admin_key() -> str:
    return secrets.token_urlsafe(32)


def check_admin_key(key: str) -> str:
    """Keys go into Triton's `<apis>:<header>=<key>` flags: 16-256 URL-safe characters."""
    if not _KEY_RE.fullmatch(key or ""):
        raise ServeError("the admin key must be 16-256 characters of A-Z a-z 0-9 . _ ~ -",
                         hint="e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return key


@dataclasses.dataclass(frozen=True)
class GrpcTls:
    """TLS of the server's gRPC endpoint (PEM files). With `client_ca` clients must present a
    certificate signed by it (mutual TLS). Triton's HTTP endpoint has no TLS: put a proxy in front."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def args(self) -> list[str]:
        for what, path in (("certificate", self.cert), ("key", self.key), ("client CA", self.client_ca)):
            if path is not None and not Path(path).is_file():
                raise ServeError(f"gRPC TLS {what} file not found: {path}", hint="pass PEM files")
        args = ["--grpc-use-ssl=true", f"--grpc-server-cert={Path(self.cert).resolve()}",
                f"--grpc-server-key={Path(self.key).resolve()}"]
        if self.client_ca is not None:
            args += ["--grpc-use-ssl-mutual=true", f"--grpc-root-cert={Path(self.client_ca).resolve()}"]
        return args


# --------------------------------------------------------------------------------------------
# Processes: identity, leftovers of a killed server
# --------------------------------------------------------------------------------------------


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the pid it
    names one process for good (a reused pid has a later start time)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def proc_cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode("utf-8", errors="replace") for a in raw.split(b"\0")[:-1]] if raw else None


def is_our_server(pid: int, start_time: int | None, cmdline: Sequence[str] | None) -> bool:
    """Whether `pid` is still the server that was recorded with this start time and command line
    (both must be recorded and match; a zombie or a reused pid is not)."""
    if not start_time or not cmdline:
        return False
    return proc_start_time(pid) == start_time and proc_cmdline(pid) == list(cmdline)


def find_stubs(shm_prefix: str) -> list[int]:
    """Python-backend stub processes of the server that used `shm_prefix` (their argv holds a region
    name starting with it). Only trtspec's own prefixes are matched."""
    if not _PREFIX_RE.fullmatch(shm_prefix or ""):
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        args = proc_cmdline(int(entry.name)) or []
        if args and args[0].endswith("triton_python_backend_stub") and any(a.startswith(shm_prefix) for a in args):
            found.append(int(entry.name))
    return found


def clean_leftovers(shm_prefix: str, work_dir: str | Path | None = None) -> dict[str, list]:
    """Remove what a server that is gone left behind: its stub processes (SIGKILL: a stub ignores
    SIGTERM, and an orphaned one may be stuck in futex waits on the dead server's locks), its
    `/dev/shm/<prefix>*` regions and, if given, its work dir."""
    stubs = find_stubs(shm_prefix)
    for pid in stubs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(pid_alive(p) for p in stubs):
        time.sleep(0.05)
    shm = remove_shm(shm_prefix) if _PREFIX_RE.fullmatch(shm_prefix or "") else []
    if work_dir is not None and Path(work_dir).is_dir():
        shutil.rmtree(work_dir, ignore_errors=True)
    return {"stubs": stubs, "shm": shm}


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


# --------------------------------------------------------------------------------------------
# Draining
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Endpoints:
    host: str                  # where clients on this machine connect
    http_port: int
    grpc_port: int
    metrics_port: int
    bind: str = LOOPBACK       # the address the server listens on
    grpc_tls: bool = False

    @property
    def http_url(self) -> str:
        return f"{url_host(self.host)}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{url_host(self.host)}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{url_host(self.host)}:{self.metrics_port}/metrics"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "http_url": self.http_url, "grpc_url": self.grpc_url,
                "metrics_url": self.metrics_url}


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
    (the server and its Python-backend stubs). Returns the exit code when it is our child.
    The caller checks that `pid` is the server (`is_our_server`) and drains it first."""

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
