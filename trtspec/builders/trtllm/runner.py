"""Runs one `trtllm-build` command out of process: live logs, a rich progress line, a timeout,
and a BuildError with the log's tail when the tool is missing or fails.

This module is the ONE place trtspec starts TensorRT-LLM; `tensorrt_llm` is never imported.
"""

from __future__ import annotations

import collections
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

from trtspec.errors import BuildError

TAIL_LINES = 40
_INSTALL_HINT = ("install TensorRT-LLM {version} (NVIDIA's package index; needs a GPU), run inside the Triton "
                 "TRT-LLM container, or pass --trtllm-build 'docker' to wrap {image}")


def _resolve(argv: list[str], version: str, image: str) -> None:
    exe = argv[0]
    found = shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) else None)
    if not found:
        raise BuildError(f"`{exe}` not found" + (" on PATH" if os.sep not in exe else " or not executable"),
                         hint=_INSTALL_HINT.format(version=version, image=image))


def _reader(stream, q: queue.Queue) -> None:
    for raw in iter(stream.readline, b""):
        q.put(raw.decode("utf-8", "replace").rstrip("\n"))
    q.put(None)


def _terminate(proc: subprocess.Popen, argv: list[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
    if argv[:2] == ["docker", "run"]:  # the client dying does not stop the container
        name = next((a.split("=", 1)[1] for a in argv if a.startswith("--name=")), None)
        if name:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)


def run_command(argv: list[str], *, label: str, log_path: Path, timeout_s: float, progress: bool = True,
                version: str = "", image: str = "", env: dict[str, str] | None = None) -> float:
    """Run argv, tee its merged output to log_path; returns seconds. Raises BuildError."""
    _resolve(argv, version, image)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    t0 = time.monotonic()
    console = progress_bar = task = None
    if progress:
        from rich.console import Console
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        progress_bar = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), TimeElapsedColumn(),
                                TextColumn("[dim]{task.fields[last]}"), console=console, transient=True)
        progress_bar.start()
        task = progress_bar.add_task(f"trtllm-build {label}", last="starting")
    try:
        with open(log_path, "w", encoding="utf-8") as log:
            log.write(f"$ {' '.join(argv)}\n")
            try:
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        env={**os.environ, **(env or {})})
            except OSError as exc:
                raise BuildError(f"cannot start `{argv[0]}`: {exc}",
                                 hint=_INSTALL_HINT.format(version=version, image=image)) from None
            q: queue.Queue = queue.Queue()
            threading.Thread(target=_reader, args=(proc.stdout, q), daemon=True).start()
            deadline = t0 + timeout_s
            done = False
            while not done:
                left = deadline - time.monotonic()
                if left <= 0:
                    _terminate(proc, argv)
                    raise BuildError(
                        f"trtllm-build for {label} timed out after {timeout_s:.0f}s; last lines:\n" + "\n".join(tail),
                        hint=f"raise runtime.trtllm.build_timeout_s; full log: {log_path}")
                try:
                    line = q.get(timeout=min(left, 0.2))
                except queue.Empty:
                    continue
                if line is None:
                    done = True
                    continue
                log.write(line + "\n")
                log.flush()
                tail.append(line)
                if progress_bar is not None:  # live log above the progress line
                    console.print(f"  {label}| {line}", markup=False, highlight=False, soft_wrap=True)
                    progress_bar.update(task, last=line[-80:])
            rc = proc.wait()
    finally:
        if progress_bar is not None:
            progress_bar.stop()
    if rc != 0:
        raise BuildError(f"trtllm-build for {label} failed with exit code {rc}; last lines:\n" + "\n".join(tail),
                         hint=f"full log: {log_path}")
    return time.monotonic() - t0
