"""Loading a model on a thread of its own, so that its OpenMP threads end with it.

torch's CPU kernels (and trtspec's own, runtime/kernels) run their parallel loops on OpenMP (GCC's libgomp):
every thread that starts a parallel loop gets a team of worker threads of its own, which lives as long as that
thread does. libgomp counts all of them, and once the process holds more of them than it has CPUs, every worker
stops spinning between two parallel loops and sleeps on a futex instead (gcc libgomp/config/linux/wait.h:
`gomp_throttled_spin_count_var` when `gomp_managed_threads > gomp_available_cpus`). A decode step runs
hundreds of short parallel loops, so each one then pays a sleep and a wake-up.

That is what happens to an engine loaded on one thread (quantizing, packing and timing its costs run parallel
loops there) and driven by another, its scheduler thread (`SpecEngine.submit`, as the served model does):
measured on a 2-CPU machine, the same engine decoded 15-20 % slower on the scheduler thread than on the thread
that loaded it, with ~45,000 voluntary context switches over two requests against none. Loaded by
`on_own_thread`, the loading thread's team ends with it, and the scheduler thread decodes as fast as any.
"""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def on_own_thread(fn: Callable[[], T], name: str = "trtspec-load") -> T:
    """fn() on a new thread, waited for: its result, or its exception raised here. The thread ends before this
    returns, and with it the OpenMP workers its parallel loops started."""
    result: list[T] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            error.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)  # (daemon: an interrupted load cannot hang exit)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
