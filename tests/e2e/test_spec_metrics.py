"""The generation model's Prometheus families read the engine's per-step SpecDecodingStats: per-position
accepted-token counters (as vLLM's spec_decode_num_accepted_tokens_per_pos) next to the totals, against the
shared server of conftest.py."""

from __future__ import annotations

import re
import urllib.request

import pytest

from trtspec.client import generate_remote

pytestmark = pytest.mark.e2e
PER_POSITION = "spec_dec_accepted_tokens_per_position_total"


def _samples(e2e, method: str) -> dict[tuple[str, str], float]:
    """{(name, position or ""): value} of one method's spec_dec_* samples."""
    text = urllib.request.urlopen(e2e.server.metrics_url, timeout=10).read().decode()
    out = {}
    for name, labels, value in re.findall(r"^(spec_dec_\w+)\{([^}]*)\} (\S+)$", text, re.M):
        if f'method="{method}"' in labels:
            position = re.search(r'position="(\d+)"', labels)
            out[(name, position.group(1) if position else "")] = float(value)
    return out


@pytest.mark.parametrize("method", ["draft-model", "medusa"])  # a chain and (demo medusa) a tree
def test_accepted_tokens_per_position(e2e, method):
    deployment = e2e.deployments[method]
    before = _samples(e2e, method)
    result = generate_remote(e2e.server.grpc_url, e2e.prompts[0], model=deployment.ensemble, max_tokens=32,
                             timeout=120)
    after = _samples(e2e, method)

    def delta(name, position=""):
        return after.get((name, position), 0.0) - before.get((name, position), 0.0)

    positions = sorted(int(p) for n, p in after if n == PER_POSITION)
    assert positions == list(range(len(positions))) and positions  # one counter per draft position
    per_position = [delta(PER_POSITION, str(p)) for p in positions]
    assert sum(per_position) == delta("spec_dec_accepted_tokens_total") == result.total_accepted_draft_tokens
    assert per_position == sorted(per_position, reverse=True)  # a path reaching depth i+1 passed depth i
    assert per_position[0] <= delta("spec_dec_drafts_total") <= delta("spec_dec_steps_total") == result.steps
    assert delta("spec_dec_drafts_total") > 0
