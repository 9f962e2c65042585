"""The processes of a bundled server: which process a recorded pid still is (/proc identity), stopping one,
and what a killed server leaves behind (Python-backend stub processes holding its shared-memory prefix, its
`/dev/shm/<prefix>*` regions).

A pid is only ever signalled while it is still the process trtspec started: its start time and command line
match the recorded ones (a reused pid has a later start time).
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

_SHM_DIR = Path("/dev/shm")
_PREFIX_RE = re.compile(r"trtspec_\d+_[0-9a-f]{8}_")


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

