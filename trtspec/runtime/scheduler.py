"""The scheduler half of SpecEngine (vLLM v1 splits a scheduler from the model runner): which requests run.

Requests (request.py) are validated where they enter, then wait in a FIFO. Each tick ends cancelled requests,
admits waiting ones into free rows (the runner prefills their prompts together in one pass) and then runs one
decode step for every active request. A finished request's row is refilled by the next one; active rows stay
dense (the last row moves into the hole, `retire`), so a step runs on a plain slice of the caches. All model
state is touched by one tick at a time (a lock); `submit` starts one background thread running ticks, the
synchronous APIs drive ticks themselves when it does not run. A failing tick fails the requests in flight
and leaves the engine usable for the next ones.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from trtspec.errors import GenerationError
from trtspec.runtime.request import Request


class Runner(Protocol):
    """The model side (SpecEngine): runs what the scheduler decides, returns the requests that ended."""

    def prefill(self, reqs: list[Request], row0: int) -> list[Request]: ...

    def step(self, reqs: list[Request]) -> list[Request]: ...

    def move_row(self, src: int, dst: int) -> None: ...

    def free_row(self, row: int) -> None: ...

    def reset(self) -> None: ...


class Scheduler:
    """FIFO admission into `max_batch` dense rows, the background thread, cancellation and drain."""

    def __init__(self, max_batch: int, runner: Runner):
        self.max_batch, self.runner = max_batch, runner
        self.active: list[Request] = []    # request b runs in row b
        self.waiting: list[Request] = []
        self._cv = threading.Condition()
        self._lock = threading.RLock()     # one tick at a time
        self._thread: threading.Thread | None = None
        self._closing = False
        self._draining = False             # drain(): no new requests

    @property
    def running(self) -> bool:
        """The background thread drives the ticks."""
        return self._thread is not None and self._thread.is_alive()

    def enqueue(self, reqs: list[Request]) -> None:
        with self._cv:
            if self._closing:
                raise GenerationError("the engine is closed")
            if self._draining:
                raise GenerationError("the server is shutting down: not accepting new requests",
                                      hint="retry against another replica or after the restart")
            self.waiting.extend(reqs)
            self._cv.notify_all()

    def start(self) -> None:
        """Start the background thread, unless it runs."""
        with self._cv:
            if not self.running:
                if self._closing:
                    raise GenerationError("the engine is closed")
                self._thread = threading.Thread(target=self._loop, name="trtspec-scheduler", daemon=True)
                self._thread.start()

    def cancel(self, request_id: str) -> None:
        with self._cv:
            for r in self.waiting + self.active:
                if r.id == request_id:
                    r.cancelled = True
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closing = True
            for r in self.waiting + self.active:
                r.cancelled = True
            self._cv.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=60)
        self.tick()  # deliver the cancellations

    def drain(self, deadline: float, refuse_new: bool = True, on_idle: Callable[[], None] | None = None,
              poll: float = 0.05) -> bool:
        """See SpecEngine.drain."""
        with self._cv:
            self._draining = self._draining or refuse_new
        idle_seen = False
        while time.monotonic() < deadline:
            with self._cv:
                idle = not self.waiting and not self.active
            if idle and not idle_seen:
                idle_seen = True
                if on_idle is not None:
                    on_idle()
                if refuse_new:
                    return True
            time.sleep(poll)
        with self._lock:  # between two ticks
            with self._cv:
                self._draining = True
                waiting, self.waiting = self.waiting, []
            active = list(self.active)
            for r in active:
                self.finish(r, "shutdown")
            for r in waiting:
                self.finish(r, "shutdown", active=False)
        if on_idle is not None and not idle_seen:
            on_idle()
        return not (active or waiting)

    def drive(self, done: Callable[[], bool]) -> None:
        """Run ticks on this thread until `done()`."""
        while not done():
            self.tick()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closing and not self.waiting and not self.active:
                    self._cv.wait()
                if self._closing:
                    return
            self.tick()

    def tick(self) -> None:
        """Cancellations, admissions (prefill), then one decode step for every active request."""
        with self._lock:
            new: list[Request] = []
            try:
                for r in [r for r in self.active if r.cancelled]:
                    self.finish(r, "cancelled")
                with self._cv:
                    gone = [r for r in self.waiting if r.cancelled]
                    self.waiting = [r for r in self.waiting if not r.cancelled]
                    free = self.max_batch - len(self.active)
                    new, self.waiting = self.waiting[:free], self.waiting[free:]
                for r in gone:
                    self.finish(r, "cancelled", active=False)
                if new:
                    row0 = len(self.active)
                    self.active.extend(new)
                    # tokens go out after admission: a request that ends at once frees its row the usual way
                    self.retire(self.runner.prefill(new, row0))
                if self.active:
                    self.retire(self.runner.step(self.active))
            except Exception as exc:  # fail the requests in flight, keep the engine usable for the next ones
                failed = list(self.active) + [r for r in new if r.result is None and r not in self.active]
                self.active = []
                self.runner.reset()
                for r in failed:
                    r.error = exc
                    self.finish(r, "error", active=False)

    def retire(self, ended: list[Request]) -> None:
        """Free the rows of finished requests, keeping active rows dense (the last row moves into the hole)."""
        for i in sorted((self.active.index(r) for r in ended if r in self.active), reverse=True):
            last = len(self.active) - 1
            if i != last:
                self.runner.move_row(last, i)
                self.active[i] = self.active[last]
            else:
                self.runner.free_row(i)
            self.active.pop()

    def finish(self, r: Request, reason: str, active: bool = True) -> None:
        r.finish(reason)
        if active and r in self.active:
            self.retire([r])
