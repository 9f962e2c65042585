"""stats: one SpecDecodingStats per engine step (what on_step observers get, before the step's events), one
RequestStats per request, and one tokens-per-step definition that the engine's results, the client, the
benchmark, the CLI and the served gauges all read (verify-step tokens / verify steps, 0.0 with no step)."""

from __future__ import annotations

import pytest

from tests.runtime.family import engine
from trtspec.runtime import SamplingParams
from trtspec.runtime.request import StepEvent
from trtspec.runtime.stats import RequestStats, SpecDecodingStats, acceptance_rate, tokens_per_step

PROMPTS = [[5, 6, 7], [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [40], [3, 3, 3, 3]]


def test_step_totals_and_accepted_per_position():
    s = SpecDecodingStats(depths=[3, 0, 2, 4], drafted=[3, 0, 5, 4], accepted=[2, 0, 2, 0], emitted=[3, 1, 2, 1],
                          draft_seconds=0.1, verify_seconds=0.2)
    assert (s.batch_size, s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, s.num_emitted_tokens) == \
        (4, 3, 12, 4, 7)
    assert s.accepted_per_position == [2, 2, 0, 0]  # one counter per draft position up to the deepest draft
    assert acceptance_rate(s.num_accepted_tokens, s.num_draft_tokens) == pytest.approx(4 / 12)
    assert tokens_per_step(s.num_emitted_tokens, s.batch_size) == pytest.approx(7 / 4)


def test_request_stats_count_verify_steps_after_the_prefill():
    s = RequestStats()
    for ev in (StepEvent("r", [7]),                                     # the prefill's token
               StepEvent("r", [1, 2, 3], drafted=4, accepted=2, draft_seconds=0.5, verify_seconds=1.0),
               StepEvent("r", [4], drafted=4, accepted=0, draft_seconds=0.5, verify_seconds=1.0),
               StepEvent("r", [], finished=True, finish_reason="cancelled")):
        s.observe(ev)
    assert (s.events, s.tokens, s.steps, s.step_tokens, s.drafted, s.accepted) == (4, 5, 2, 4, 8, 2)
    assert s.tokens_per_step == 2.0 and s.acceptance_rate == 0.25
    assert (s.draft_seconds, s.verify_seconds) == (1.0, 2.0)
    assert RequestStats().tokens_per_step == 0.0 and tokens_per_step(3, 0) == 0.0


def test_every_consumer_reads_the_one_definition(fam):
    """The same request counted by the engine, the gRPC client's result, the benchmark's run stats, the CLI's
    local stream and the served gauge gives one number; with no verify step, 0.0 everywhere."""
    from trtspec.bench.compare import RunStats
    from trtspec.cli.generate import _stream_local
    from trtspec.client.remote import RemoteResult
    from trtspec.repository.serving import RecentSteps

    eng = engine(fam, "draft-model", draft="draft_near")
    for n in (24, 1):  # speculative steps; only the prefill's token
        sp = SamplingParams(max_new_tokens=n, end_id=-1, num_draft_tokens=3)
        steps: list[SpecDecodingStats] = []
        eng.on_step.append(steps.append)
        r = eng.generate(PROMPTS[1], sp)
        eng.on_step.remove(steps.append)
        assert (r.steps > 0) == (n > 1) and len(r.tokens) == n
        remote = RemoteResult(text=r.text, new_tokens=len(r.tokens), seconds=1.0, ttft_seconds=None,
                              acceptance_rate=r.acceptance_rate, total_draft_tokens=r.drafted,
                              total_accepted_draft_tokens=r.accepted, steps=r.steps, responses=1)
        bench = RunStats("spec", 1, len(r.tokens), 1.0, [], [], r.drafted, r.accepted, r.steps)
        cli = _stream_local(eng, PROMPTS[1], sp, lambda text: None)
        gauge = RecentSteps()
        per_step = [gauge.add(s)[1] for s in steps][-1] if steps else 0.0
        want = (len(r.tokens) - 1) / r.steps if r.steps else 0.0
        assert [r.tokens_per_step, remote.tokens_per_step, bench.tokens_per_step, cli["tokens_per_step"],
                per_step] == pytest.approx([want] * 5), n


def test_on_step_reports_every_step_before_its_events(fam):
    eng = engine(fam, "draft-model", draft="draft_near", batch=3)
    steps: list[SpecDecodingStats] = []
    eng.on_step.append(steps.append)
    res = eng.generate_batch(PROMPTS, SamplingParams(max_new_tokens=20, end_id=-1, num_draft_tokens=4))
    assert sum(s.batch_size for s in steps) == sum(r.steps for r in res) > 0
    assert sum(s.num_draft_tokens for s in steps) == sum(r.drafted for r in res) > 0
    assert sum(s.num_accepted_tokens for s in steps) == sum(r.accepted for r in res) > 0
    assert sum(s.num_emitted_tokens for s in steps) == sum(len(r.tokens) - 1 for r in res)
    assert max(s.batch_size for s in steps) == 3  # batched steps: one stats object for the whole batch
    for s in steps:
        assert all(a <= d for a, d in zip(s.accepted, s.depths))
        assert sum(s.accepted_per_position) == s.num_accepted_tokens
    # streaming: when a step's event arrives, that step's stats were already observed (the exporter's
    # counters are up to date when a client sees the response)
    steps.clear()
    for i, ev in enumerate(eng.stream(PROMPTS[0], SamplingParams(max_new_tokens=12, end_id=-1))):
        assert len(steps) >= i


def test_a_failing_observer_fails_no_request(fam):
    eng = engine(fam, "none")
    want = eng.generate(PROMPTS[0], SamplingParams(max_new_tokens=8)).tokens

    def broken(stats):
        raise RuntimeError("observer bug")

    eng.on_step.append(broken)
    assert eng.generate(PROMPTS[0], SamplingParams(max_new_tokens=8)).tokens == want
