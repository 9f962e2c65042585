"""SpecEngine.drain: the generation model's part of a graceful server shutdown (trtspec/serve/drain.py)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.runtime import family
from trtspec.errors import GenerationError
from trtspec.runtime import SamplingParams

PROMPT = [1, 5, 9, 14, 3]


def test_drain_lets_requests_in_flight_finish_then_refuses_new_ones(fam):
    engine = family.engine(fam, "none")
    params = SamplingParams(max_new_tokens=24, end_id=-1)
    full = engine.generate(PROMPT, params).tokens
    stream = engine.stream(PROMPT, params)  # no scheduler thread: this thread drives the steps
    tokens = list(next(stream).tokens)
    idle = threading.Event()
    result = {}
    drainer = threading.Thread(target=lambda: result.setdefault(
        "all_finished", engine.drain(time.monotonic() + 600, on_idle=idle.set)))
    drainer.start()
    events = list(stream)
    drainer.join(timeout=60)
    assert result == {"all_finished": True} and idle.is_set()
    assert tokens + [t for e in events for t in e.tokens] == full
    assert events[-1].finish_reason == "length"
    with pytest.raises(GenerationError, match="shutting down"):
        engine.submit(PROMPT, params, lambda event: None)


def test_drain_deadline_ends_requests_still_running_with_a_shutdown_event(fam):
    engine = family.engine(fam, "none")
    params = SamplingParams(max_new_tokens=24, end_id=-1)
    full = engine.generate(PROMPT, params).tokens
    stream = engine.stream(PROMPT, params)
    first = next(stream)
    assert not first.finished
    assert engine.drain(time.monotonic() - 1.0) is False  # deadline passed: cut what runs
    rest = list(stream)  # (events of the step already done, then the cut)
    assert [e.finish_reason for e in rest][-1:] == ["shutdown"] and rest[-1].finished and not rest[-1].tokens
    sent = first.tokens + [t for e in rest for t in e.tokens]
    assert 0 < len(sent) < len(full) and full[: len(sent)] == sent  # what was sent is the true prefix
    assert engine.num_active == 0 and engine.num_waiting == 0
    with pytest.raises(GenerationError, match="shutting down"):
        engine.generate(PROMPT, params)
