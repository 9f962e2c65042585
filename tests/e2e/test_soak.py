"""The lighter soak of `make test` (`make soak` runs bench/soak.py: 16 clients x 120 s): 4 concurrent streaming
clients for ~10 s against one served draft-model deployment; every greedy output must equal its in-process
plain-decoding reference, no request may fail, and the server must stop cleanly. Behaviour only: the run's
latencies and memory are printed by bench/soak.py, never asserted."""

from __future__ import annotations

import pytest

from bench.soak import PROMPTS, report, run_soak
from tests.e2e.conftest import DEMO_MODELS, DEMO_SPECS, _tiny_specs
from trtspec.check import load_spec

pytestmark = pytest.mark.e2e


def test_a_short_soak_serves_every_request_exactly(tmp_path):
    demo = (DEMO_MODELS / "MANIFEST.json").is_file()
    spec = load_spec(DEMO_SPECS / "draft-model.toml" if demo else _tiny_specs(tmp_path / "family")["draft-model"])
    prompts = PROMPTS[:4] if demo else ["w1 w2 w3 w4 w5", "w10 w20 w30", "w7 w7 w8 w9", "w3"]
    clients = 4
    result = run_soak(spec, clients=clients, duration=10, max_tokens=32, prompts=prompts, interval=1.0,
                      out=tmp_path / "soak", log=lambda *_: None)
    print(report(result))
    assert result.errors == 0 and result.mismatches == 0, result.examples
    assert result.requests >= clients  # every client started at least one request before the time was up
    assert len(result.latency_s) == result.requests and result.tokens > 0
    assert result.rss and all(procs >= 2 for _, _, procs in result.rss)  # the server and its stubs were measured
    assert result.server_exit == 0  # drained and stopped cleanly: no request was left hanging
