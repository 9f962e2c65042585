"""Engines load on a thread of their own (runtime/threads.py): its OpenMP workers end with it, so the thread that
drives the engine later (the served model's scheduler thread) is not slowed by a process holding more OpenMP
threads than CPUs."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from tests.runtime.family import write_spec
from trtspec import methods
from trtspec.check import load_spec
from trtspec.runtime.engine import SpecEngine
from trtspec.runtime.sampling import SamplingParams
from trtspec.runtime.threads import on_own_thread


def test_it_returns_the_result_and_raises_the_functions_own_error_on_the_callers_thread():
    assert on_own_thread(lambda: threading.current_thread()) is not threading.current_thread()

    class Broken(Exception):
        pass

    def fail():
        raise Broken("no model here")

    with pytest.raises(Broken, match="no model here"):
        on_own_thread(fail)


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _settled(expected: int, seconds: float = 10.0) -> int:
    """The process's thread count once it is `expected` (the workers of an ended team exit just after it), or
    after `seconds`."""
    deadline = time.monotonic() + seconds
    while _threads() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return _threads()


def _parallel_loop() -> None:
    torch.ones(1 << 22).mul_(2.0)  # elementwise over 4M floats: at::parallel_for splits it over the threads


@pytest.fixture
def two_threads():
    """torch with two threads for one test (the suite runs with one: tests/runtime/conftest.py)."""
    if not os.path.isdir("/proc/self/task") or (os.cpu_count() or 1) < 2:
        pytest.skip("needs Linux's /proc and at least two CPUs")
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


def test_the_openmp_workers_a_thread_starts_end_with_it_and_live_as_long_as_it_does(two_threads):
    before = _threads()
    on_own_thread(_parallel_loop)
    assert _settled(before) == before  # the loading thread and its OpenMP team are gone
    # the contrast: a thread that is still alive keeps the workers its parallel loop started
    hold, ran = threading.Event(), threading.Event()

    def stays():
        _parallel_loop()
        ran.set()
        hold.wait()

    t = threading.Thread(target=stays, daemon=True)
    t.start()
    try:
        assert ran.wait(60)
        assert _threads() >= before + 2  # the thread itself and at least one OpenMP worker of its team
    finally:
        hold.set()
        t.join()


def test_methods_engine_loads_the_models_on_a_thread_that_has_ended_before_it_returns(fam, monkeypatch):
    seen: list[threading.Thread] = []
    original = SpecEngine.from_spec.__func__

    def spy(cls, *args, **kwargs):
        seen.append(threading.current_thread())
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(SpecEngine, "from_spec", classmethod(spy))
    eng = methods.engine(load_spec(write_spec(fam, "draft-model", draft="draft_near")))
    try:
        assert len(seen) == 1 and seen[0] is not threading.current_thread() and not seen[0].is_alive()
        assert eng.generate([1, 2, 3], SamplingParams(max_new_tokens=4)).tokens  # on the caller's thread
    finally:
        eng.close()


def test_the_specs_torch_threads_hold_on_the_callers_thread_too(fam, two_threads):
    """torch.set_num_threads sets the calling thread's OpenMP team size (and the default of threads yet to run
    one): a spec's `[runtime.torch] threads` must reach the caller, which may drive the engine, not only the
    thread that loaded it."""
    _parallel_loop()  # this thread has run a parallel loop at two threads
    eng = methods.engine(load_spec(write_spec(fam, "none", extra="[runtime.torch]\nthreads = 1")))
    try:
        assert torch.get_num_threads() == 1
    finally:
        eng.close()
