"""Cost-aware adaptive K: the cost table (measured once, or injected) and the priced choice of K."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from tests.runtime.family import engine, write_spec
from tests.runtime.test_engine import make_prompts
from trtspec import methods
from trtspec.check import load_spec
from trtspec.errors import SpecError
from trtspec.runtime import costs
from trtspec.runtime.adaptive import AdaptiveConfig, AdaptiveK, Price, SharedAcceptance, best, expected_tokens
from trtspec.runtime.costs import CostTable
from trtspec.runtime.request import Request
from trtspec.runtime.sampling import SamplingParams

CHAIN = [(k, k) for k in range(1, 9)]


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(2, seed=0)


def table(verify: dict[int, float], draft: float) -> CostTable:
    return CostTable(verify, {"*": draft}, "test")


def brute_force(alpha: float, verify, draft: float, batch: int = 1) -> dict[int, float]:
    """Per chain K: E[tau](alpha, K) * verify(B) / (verify(B (K + 1)) + K draft(B)), written out (draft: the
    seconds of a draft step of B requests together)."""
    return {k: expected_tokens(alpha, k) * verify(batch) / (verify(batch * (k + 1)) + k * draft) for k in range(1, 9)}


# ------------------------------------------------------------------------------------------- the table

def test_the_table_interpolates_between_measured_rows_and_grows_in_proportion_past_them():
    t = CostTable({1: 1.0, 5: 2.0, 10: 3.0}, {"ngram": 0.01, "*": 0.2})
    assert t.verify_seconds(1) == 1.0 and t.verify_seconds(3) == 1.5 and t.verify_seconds(7.5) == 2.5
    assert t.verify_seconds(20) == 6.0
    assert t.draft_seconds("ngram") == 0.01 and t.draft_seconds("draft-model") == 0.2
    assert CostTable.from_dict(json.loads(json.dumps(t.to_dict()))).verify == t.verify


def test_a_draft_step_is_priced_by_the_requests_drafting_together():
    """Measured batch sizes: linear between them, in proportion past the largest; a drafter with none measured
    (an older table, or an injected one that does not say) costs one request's step at every batch."""
    t = CostTable({1: 1.0}, {"draft-model": 0.1, "ngram": 0.01}, "test", {"draft-model": {2: 0.12, 4: 0.2}})
    assert [t.draft_seconds("draft-model", b) for b in (1, 2, 3, 4, 8)] == pytest.approx([0.1, 0.12, 0.16, 0.2, 0.4])
    assert t.draft_seconds("ngram", 1) == t.draft_seconds("ngram", 4) == 0.01
    again = CostTable.from_dict(json.loads(json.dumps(t.to_dict())))
    assert again.draft_by_batch == {"draft-model": {2: 0.12, 4: 0.2}} and again.draft == t.draft
    assert "draft_by_batch" not in CostTable({1: 1.0}, {"*": 0.1}).to_dict()  # the older shape, unchanged


def test_draft_steps_are_measured_at_doubling_batch_sizes_up_to_the_batch():
    assert [costs.batch_sizes(b) for b in (1, 2, 4, 6, 16)] == [[], [2], [2, 4], [2, 4, 6], [2, 4, 8, 16]]


@pytest.mark.parametrize("data", [{"verify": {"2": 1.0}}, {"verify": {"1": -1.0}}, {"verify": {"x": 1.0, "1": 1}},
                                  {"verify": {"1": float("nan")}}, {"draft": {}}, [1, 2], {"verify": {"1": 0}},
                                  {"verify": {"1": 1}, "draft_by_batch": {"ngram": 0.1}},
                                  {"verify": {"1": 1}, "draft_by_batch": {"ngram": {"two": 0.1}}},
                                  {"verify": {"1": 1}, "draft_by_batch": {"ngram": {"0": 0.1}}},
                                  {"verify": {"1": 1}, "draft_by_batch": {"ngram": {"2": -0.1}}}])
def test_a_bad_table_is_a_spec_error(data):
    with pytest.raises(SpecError):
        CostTable.from_dict(data)


def test_the_env_var_injects_a_table_and_a_bad_file_is_named(tmp_path, monkeypatch):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"verify": {"1": 2.0, "8": 3.0}, "draft": {"*": 0.5}}))
    monkeypatch.setenv(costs.ENV, str(path))
    assert costs.from_env().verify == {1: 2.0, 8: 3.0}
    path.write_text("{not json")
    with pytest.raises(SpecError, match="costs.json"):
        costs.from_env()


def test_measure_keeps_the_least_of_its_rounds(monkeypatch):
    """Interference only adds time: one slow round (another model loading) must not move the table."""
    clock = [0.0]
    rounds = {1: iter([9.0, 1.0, 1.1, 5.0, 1.0, 1.2]), 5: iter([9.0, 1.3, 4.0, 1.2, 6.0, 1.25])}  # warm-up first
    monkeypatch.setattr(costs.time, "perf_counter", lambda: clock[0])

    def run(n):
        def go():
            clock[0] += next(rounds[n])
        return go

    assert costs.measure({1: run(1), 5: run(5)}, repeats=5) == pytest.approx({1: 1.0, 5: 1.2})


def test_calibrations_take_turns_and_a_long_turn_is_not_waited_for(tmp_path, monkeypatch, caplog):
    import fcntl
    import os

    monkeypatch.setattr(costs.tempfile, "tempdir", str(tmp_path))
    with costs.one_at_a_time():
        fd = os.open(costs.turn_file(), os.O_RDWR)  # another process's calibration: its own open file
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        with caplog.at_level("WARNING"), costs.one_at_a_time(wait_s=0.2):  # measures anyway, and says so
            assert "without taking turns" in caplog.text
    fd = os.open(costs.turn_file(), os.O_RDWR)  # the turn ended with the block
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_row_counts_go_to_the_most_one_request_verifies_then_double_up_to_the_batch():
    assert costs.row_counts(5, 1) == [1, 2, 3, 4, 5]
    assert costs.row_counts(5, 4) == [1, 2, 3, 4, 5, 10, 20]
    assert costs.row_counts(3, 6) == [1, 2, 3, 6, 12, 18]
    assert costs.row_counts(40, 2) == list(range(1, 17)) + [20, 25, 31, 38, 40, 80]  # a large tree: sparser
    assert costs.shape(4, 5) == (1, 4) and costs.shape(20, 5) == (4, 5)


def test_an_injected_table_is_used_as_is_and_nothing_is_timed(fam, monkeypatch):
    monkeypatch.setattr(costs, "calibrate", lambda *a, **k: pytest.fail("an injected table must not be measured"))
    eng = engine(fam, "draft-model", draft="draft_near")
    assert eng.costs.source == costs.from_env().source  # the conftest's nominal table
    given_table = table({1: 1.0, 4: 1.5}, 0.3)
    eng = methods.engine(load_spec(write_spec(fam, "draft-model", draft="draft_near")), costs=given_table)
    assert eng.costs is given_table and eng.prices[0].draft_seconds(1) == eng.prices[0].draft_seconds(4) == 0.3


def test_a_measured_table_is_fixed_once_made_and_its_outputs_equal_plain_decoding(fam, monkeypatch, prompts):
    """Without an injected table the engine measures one at load (every row count, every drafter) and keeps
    it; seeded sampled outputs repeat, and greedy outputs equal plain decoding."""
    monkeypatch.delenv(costs.ENV)
    for method, kw in (("draft-model", {"draft": "draft_near"}), ("ngram", {})):
        eng = engine(fam, method, k=4, batch=2, **kw)
        t = eng.costs
        assert t.source == "measured" and list(t.verify) == costs.row_counts(eng.max_rows, 2)
        assert all(s > 0 for s in t.verify.values()) and set(t.draft) == {method}
        assert list(t.draft_by_batch) == [method] and list(t.draft_by_batch[method]) == [2]  # two requests together
        assert list(t.catch_up) == [method] and t.catch_up[method] >= 0
        assert method == "draft-model" or t.catch_up[method] == 0.0  # ngram never lags: nothing measured
        assert eng.num_active == 0 and eng.cache.lengths == [0, 0]  # calibration left nothing behind
        sp = SamplingParams(max_new_tokens=24, temperature=1.0, seed=3, end_id=-1)
        first = eng.generate(prompts[0], sp)
        again = eng.generate(prompts[0], sp)
        assert eng.costs is t and (first.tokens, first.drafted) == (again.tokens, again.drafted)
        greedy = SamplingParams(max_new_tokens=24, end_id=-1)
        assert eng.generate(prompts[1], greedy).tokens == eng.generate(prompts[1], SamplingParams(
            max_new_tokens=24, end_id=-1, num_draft_tokens=0)).tokens


# ---------------------------------------------------------------------------------------- the priced K

@settings(max_examples=60, deadline=None, derandomize=True)
@given(alpha=st.floats(0.0, 1.0), slope=st.floats(0.0, 1.0), knee=st.integers(1, 9), jump=st.floats(0.0, 2.0),
       draft=st.floats(0.0, 1.2), growth=st.floats(0.0, 1.0), batch=st.integers(1, 4))
def test_k_follows_the_priced_formula_on_synthetic_tables(alpha, slope, knee, jump, draft, growth, batch):
    """Synthetic verify curves (a slope, and a jump past a knee, as int8 blocks of rows show) and draft costs
    that grow with the requests drafting together: the option adaptive K takes is the brute-force argmax, and it
    drafts only where that pays (> 1)."""
    verify = ({1: 1.0, knee: 1.0 + slope * (knee - 1), knee + 1: 1.0 + slope * knee + jump, 64: 1.0 + slope * 63 + jump}
              if knee > 1 else {1: 1.0, 2: 1.0 + slope + jump, 64: 1.0 + 63 * slope + jump})
    t = CostTable(verify, {"*": draft}, "test", {"*": {4: draft * (1 + 3 * growth)}})
    price = Price(t.verify_seconds, lambda b: t.draft_seconds("ngram", b))
    gains = brute_force(alpha, t.verify_seconds, t.draft_seconds("ngram", batch), batch)
    k, gain = best(alpha, CHAIN, price, batch)
    assert gain == pytest.approx(max(gains.values()), rel=1e-9) and gains[k] == pytest.approx(gain, rel=1e-9)
    a = AdaptiveK(CHAIN, AdaptiveConfig(history=1000), price)
    a.update(8, 0, 8)  # one observation sets alpha
    a.alpha, a.steps = alpha, a.history  # as if alpha rested on a full history
    assert a.next_k(batch) == (k if gain > 1.0 else 0)


def test_a_costlier_verify_pass_lowers_k():
    flat = Price(table({1: 1.0, 64: 1.0}, 0.05).verify_seconds, 0.05)
    int8 = Price(table({1: 1.0, 4: 1.1, 5: 2.0, 8: 2.2, 9: 3.4, 64: 24.0}, 0.05).verify_seconds, 0.05)  # blocks of 4
    assert best(0.8, CHAIN, flat)[0] == 8
    assert best(0.8, CHAIN, int8)[0] == 3  # stays inside the first block of four rows


@pytest.mark.parametrize("verify", [{1: 1.0, 64: 1.0}, {1: 1.0, 64: 20.0}, {1: 1.0, 5: 2.0, 9: 3.4, 64: 30.0}])
def test_a_drafter_whose_draft_step_costs_a_decode_step_is_never_on(verify):
    """c = draft / verify(1) = 1: even with every draft accepted the step costs at least what its tokens save."""
    price = Price(table(verify, 1.0).verify_seconds, 1.0)
    a = AdaptiveK(CHAIN, AdaptiveConfig(history=2), price)
    assert not a.pays() and a.k == 0
    assert all(a.next_k(b) == 0 for b in (1, 2, 4) for _ in range(50))


def test_a_drafter_with_c_1_is_never_on_in_the_engine(fam, prompts):
    spec = load_spec(write_spec(fam, "draft-model", draft="draft_near", k=4))
    eng = methods.engine(spec, costs=CostTable({1: 1.0, 5: 1.0}, {"draft-model": 1.0}))
    res = eng.generate(prompts[0], SamplingParams(max_new_tokens=30, end_id=-1))
    assert res.drafted == 0
    cheap = methods.engine(spec, costs=CostTable({1: 1.0, 5: 1.0}, {"draft-model": 0.05}))
    assert cheap.generate(prompts[0], SamplingParams(max_new_tokens=30, end_id=-1)).drafted > 0
    assert cheap.generate(prompts[0], SamplingParams(max_new_tokens=30, end_id=-1)).tokens == res.tokens


def test_one_bad_first_step_does_not_switch_a_drafter_off():
    """A rejected first draft gives an estimate of 0 from one step: the request keeps testing (the smallest
    useful option) until `history` steps decide, then falls back and probes."""
    a = AdaptiveK(CHAIN, AdaptiveConfig(history=4), Price(table({1: 1.0, 64: 1.0}, 0.1).verify_seconds, 0.1))
    assert a.next_k() == 8
    a.update(8, 0, 8)
    assert a.alpha == 0.0 and a.next_k() == 1
    for _ in range(3):
        a.update(1, 1, 1)  # accepted: the estimate recovers
    assert a.alpha > 0.5 and a.next_k() > 1


def test_the_best_option_follows_each_new_estimate_at_every_batch():
    """AdaptiveK keeps best() by batch while its acceptance and its rows per unit of K stay (it is asked at every
    step of every request): after each update, and at each batch, it is the module's best() of the new estimate."""
    price = Price(table({1: 1.0, 4: 1.1, 5: 2.0, 64: 30.0}, 0.1).verify_seconds, 0.1)
    a = AdaptiveK(CHAIN, AdaptiveConfig(history=2), price)
    seen = set()
    for accepted, nodes in [(8, 8), (8, 16), (0, 8), (3, 16), (1, 4), (8, 8)]:  # (8, 16): the width alone moves
        for b in (1, 2, 4, 1):
            want = best(1.0 if a.alpha is None else a.alpha, CHAIN, price, b, a.width)
            assert a.best(b) == want
            seen.add(want)
        a.update(8, accepted, 8, nodes)
    assert len(seen) > 2  # (the estimates moved the answer: a stale one would show)


def test_a_batch_is_priced_by_its_total_rows():
    """A verify pass that is flat up to 8 rows and then steep: one request drafts 7 (8 rows), four together
    draft 1 (8 rows in all), eight together nothing."""
    t = table({1: 1.0, 8: 1.0, 9: 4.0, 64: 40.0}, 0.0)
    price = Price(t.verify_seconds, 0.0)
    assert price.speedup(0.9, 1, 1, batch=4) == pytest.approx(expected_tokens(0.9, 1) * 1.0 / t.verify_seconds(8))
    assert best(0.9, CHAIN, price, 1)[0] == 7
    assert best(0.9, CHAIN, price, 4)[0] == 1
    a = AdaptiveK(CHAIN, AdaptiveConfig(), price)
    assert (a.next_k(1), a.next_k(4)) == (7, 1)
    assert t.verify_seconds(8 * 2) * 1.0 > 2 * t.verify_seconds(8) and a.next_k(8) == 0


def test_a_draft_step_that_grows_with_the_batch_stops_drafting_under_load():
    """Verify rows free, a draft step of one request 0.1 of a decode step but of four together 1.2 (a drafter whose
    multi-row passes are compute-bound): one request drafts, four together do not, whatever their acceptance."""
    t = CostTable({1: 1.0, 64: 1.0}, {"draft-model": 0.1}, "test", {"draft-model": {4: 1.2}})
    price = Price(t.verify_seconds, lambda b: t.draft_seconds("draft-model", b))
    a = AdaptiveK(CHAIN, AdaptiveConfig(history=2), price)
    for _ in range(4):
        a.update(8, 8, 8)
    assert a.alpha == 1.0 and a.next_k(1) == 8 and a.next_k(4) == 0
    one_row = AdaptiveK(CHAIN, AdaptiveConfig(history=2), Price(t.verify_seconds, t.draft_seconds("draft-model")))
    assert one_row.next_k(4) == 8  # priced at one request's draft step, as before: it drafts


def test_no_probe_or_test_at_a_batch_where_nothing_could_pay():
    """Four rows free, eight cost 2.5 decode steps, a draft step of four requests half of one: at batch 4 no
    option pays even with every draft accepted, so a request neither tests a low first estimate nor probes
    there; its probe waits for a batch where drafting could pay."""
    t = CostTable({1: 1.0, 4: 1.0, 8: 2.5, 64: 40.0}, {"*": 0.1}, "test", {"*": {4: 0.5}})
    price = Price(t.verify_seconds, lambda b: t.draft_seconds("ngram", b))
    testing = AdaptiveK(CHAIN, AdaptiveConfig(history=4), price)
    testing.update(8, 0, 8)  # a bad first step: alpha 0 on one step of four
    assert testing.next_k(1) == 1 and testing.next_k(4) == 0  # tests alone, not in a batch of four
    a = AdaptiveK(CHAIN, AdaptiveConfig(history=2), price)
    a.update(3, 0, 3)
    a.update(3, 0, 3)  # two steps: alpha 0, nothing pays: plain decoding for two steps, then a probe
    assert (a.off, a.next_k(1), a.next_k(1)) == (2, 0, 0) and a.probing
    assert [a.next_k(4) for _ in range(5)] == [0] * 5 and a.probing  # the probe waits
    assert a.next_k(1) == a.k_min == 1


def chooser(price: Price, alpha: float | None = None, shared: SharedAcceptance | None = None, **kw) -> Request:
    """An adaptive request (greedy unless `kw` sets sampling) with an acceptance estimate of `alpha` (None: none
    yet) on a full history, and its drafter's `shared` acceptance."""
    r = Request([1, 2], SamplingParams(max_new_tokens=64, **kw), lambda ev: None, frozenset(), 4, AdaptiveConfig(),
                CHAIN[:4], price, shared=shared)
    if alpha is not None:
        r.adaptive.alpha, r.adaptive.steps = alpha, r.adaptive.history
    return r


def test_a_step_of_mixed_budgets_is_priced_together_and_a_lone_probe_waits():
    """Rows up to 4 free, a draft step 0.1 of a decode step: four requests drafting 1 each pay (2 tokens each
    for 4 free rows + 0.1); one request's probe among three plain ones does not (5 tokens for 4 rows padded to 8
    rows); a seeded sampled request keeps its K whatever the others do."""
    from trtspec.runtime.adaptive import together
    from trtspec.runtime.engine import SpecEngine

    price = Price(CostTable({1: 1.0, 4: 1.0, 8: 1.6, 64: 40.0}).verify_seconds, 0.1)
    reqs = [chooser(price, 0.9) for _ in range(4)]
    assert together([(r.adaptive, 1) for r in reqs]) == pytest.approx(price.speedup(0.9, 1, 1, 4))
    assert together([(reqs[0].adaptive, 1)] + [(r.adaptive, 0) for r in reqs[1:]]) < 1.0
    assert SpecEngine._cap_together(None, reqs, [1, 1, 1, 1]) == [1, 1, 1, 1]
    assert SpecEngine._cap_together(None, reqs, [1, 0, 0, 0]) == [0, 0, 0, 0] and reqs[0].last_k == 0
    assert SpecEngine._cap_together(None, reqs, [4, 1, 1, 1]) == [1, 1, 1, 1]  # 4 x 5 rows cost more than it gives
    seeded = chooser(price, 0.9, temperature=1.0, seed=1)
    assert SpecEngine._cap_together(None, [seeded] + reqs[1:], [2, 0, 0, 0]) == [2, 0, 0, 0]
    probe = chooser(price, 0.1)
    probe.adaptive.probing = True  # priced at alpha = 1 (what it tests), still not worth three padded rows
    assert SpecEngine._cap_together(None, [probe] + reqs[1:], [1, 0, 0, 0]) == [0, 0, 0, 0] and probe.adaptive.probing
    testing = [chooser(price, None) for _ in range(3)]
    for r in testing:
        r.adaptive.update(1, 0, 1)  # one rejected draft: an estimate of 0 on one step, still being tested
    assert SpecEngine._cap_together(None, testing, [1, 1, 1]) == [1, 1, 1]


def shared_at(alpha_steps: list[tuple[int, int]], least: int = 2) -> SharedAcceptance:
    shared = SharedAcceptance(least=least)
    for accepted, trials in alpha_steps:
        shared.add(accepted, trials)
    return shared


def test_a_new_request_under_load_is_priced_at_its_drafters_shared_acceptance():
    """Rows up to 4 free, 8 rows 1.6 decode steps, a draft step 0.1: at batch 4, K = 1 pays only above an
    acceptance of 0.7. A new request (no estimate of its own) whose drafter's recent requests accepted nothing
    does not explore at batch 4 at alpha = 1 (each such test cost the whole batch its padded rows); alone it
    still does, and once its own `history` steps decide, its own acceptance prices it."""
    from trtspec.runtime.adaptive import together

    price = Price(CostTable({1: 1.0, 4: 1.0, 8: 1.6, 64: 40.0}).verify_seconds, 0.1)
    cfg = AdaptiveConfig(history=4)
    assert AdaptiveK(CHAIN[:4], cfg, price).next_k(4) == 1  # no shared acceptance: alpha = 1, it explores
    assert AdaptiveK(CHAIN[:4], cfg, price, shared_at([(0, 1)])).next_k(4) == 1  # one request-step is not one yet
    low, high = shared_at([(0, 1), (0, 1)]), shared_at([(1, 1), (1, 1)])
    assert (low.alpha, high.alpha) == (0.0, 1.0)
    new = AdaptiveK(CHAIN[:4], cfg, price, low)
    assert new.next_k(4) == 0 and new.next_k(2) == 0 and new.next_k(1) > 0
    assert AdaptiveK(CHAIN[:4], cfg, price, high).next_k(4) == 1
    assert together([(new, 1)] * 4) == pytest.approx(price.speedup(0.0, 1, 1, 4))  # priced at 0, not at 1
    for _ in range(4):
        new.update(1, 1, 1)  # its own history: every draft accepted (and fed to the shared acceptance)
    assert new.shared_alpha is None and new.alpha == 1.0 and new.next_k(4) == 1
    assert 0.0 < low.alpha < 1.0 and low.count == 6
    testing = AdaptiveK(CHAIN[:4], cfg, price, shared_at([(0, 1), (0, 1)]))
    testing.update(1, 0, 1)  # one rejected draft of its own: an estimate of 0 it keeps testing, as without one
    assert testing.shared_alpha is None and testing.next_k(4) == 1


def test_a_shared_acceptance_that_new_requests_waited_on_is_tested_again():
    """A drafter priced off under load is not off for good: after `patience` new requests in a row waited on its
    shared acceptance (none fed it), new requests explore at alpha = 1 again; the first step fed restores it."""
    price = Price(CostTable({1: 1.0, 4: 1.0, 8: 1.6, 64: 40.0}).verify_seconds, 0.1)
    shared = SharedAcceptance(least=1, patience=3)
    shared.add(0, 1)
    waiting = [AdaptiveK(CHAIN[:4], AdaptiveConfig(history=4), price, shared) for _ in range(3)]
    assert [a.next_k(4) for a in waiting[:2]] == [0, 0] and shared.waited == 2
    assert waiting[0].next_k(4) == 0 and shared.waited == 2  # a request counts once
    assert waiting[2].next_k(4) == 0 and shared.waited == 3 and shared.alpha is None
    assert [a.next_k(4) for a in waiting] == [1, 1, 1]  # tested again at alpha = 1
    waiting[0].update(1, 1, 1)
    assert shared.waited == 0 and shared.alpha == 0.5 and waiting[1].next_k(4) == 0


def test_only_greedy_and_unseeded_requests_share_their_drafters_acceptance():
    """A seeded sampled request's K must not depend on what else runs: it neither reads nor feeds it."""
    price = Price(CostTable({1: 1.0, 64: 1.0}).verify_seconds, 0.1)
    shared = shared_at([(0, 1), (0, 1)])
    assert chooser(price, shared=shared).adaptive.shared is shared
    assert chooser(price, shared=shared, temperature=1.0).adaptive.shared is shared
    seeded = chooser(price, shared=shared, temperature=1.0, seed=3)
    assert seeded.adaptive.shared is None and chooser(price, shared=shared, num_draft_tokens=2).adaptive.shared is None
    seeded.last_k = 4
    seeded.learn(4, 4)
    assert shared.count == 2


def test_a_drafter_that_lags_drafts_only_where_catching_up_pays_back():
    """A catch-up of 0.01 decode steps a token: 100 tokens behind cost one step, which drafting at 2x saves
    after 2 tokens; 1000 behind, 10 steps, more than drafting the last 5 tokens saves, not more than 64."""
    import types

    from trtspec.runtime.engine import SpecEngine

    price = Price(CostTable({1: 1.0, 8: 1.0}).verify_seconds, 0.0, catch_up=0.01)
    assert price.pays_back(100, 5, 2.0) and not price.pays_back(1000, 5, 2.0) and price.pays_back(1000, 64, 2.0)
    assert not price.pays_back(1, 64, 1.0)  # nothing saved at 1x
    lags = {0: 1000, 1: 0}
    fake = types.SimpleNamespace(proposer=types.SimpleNamespace(lag=lambda row, length: lags[row]))
    near_end, fresh = chooser(price, 0.9), chooser(price, 0.9)
    near_end.seq += [5] * 58  # 4 tokens of room left
    assert SpecEngine._paying_back(fake, [near_end, fresh], [3, 3]) == [0, 3] and near_end.last_k == 0
    lags[0] = 100
    assert SpecEngine._paying_back(fake, [near_end, fresh], [3, 3]) == [3, 3]
    # a probe tests a low acceptance: what it could pay back is priced with every draft accepted
    costly = Price(CostTable({1: 1.0, 8: 1.0}).verify_seconds, 0.3, catch_up=0.01)
    probing = chooser(costly, 0.05)
    assert costly.speedup(0.05, 1, 1) < 1.0 < costly.speedup(1.0, 1, 1)
    assert SpecEngine._paying_back(fake, [chooser(costly, 0.05), probing], [1, 1]) == [1, 1]


def test_a_draft_model_lags_by_what_its_request_decoded_plainly(fam, prompts):
    eng = engine(fam, "draft-model", draft="draft_near", k=4)
    prompt = list(prompts[0])
    req = eng._make(prompt, SamplingParams(max_new_tokens=16, end_id=-1, num_draft_tokens=0), lambda ev: None)
    eng.prefill([req], 0)
    assert eng.proposer.lag(0, len(req.seq)) == len(prompt)  # the drafter has seen nothing but will see the pending
    for _ in range(3):
        eng.step([req])
    assert eng.proposer.lag(0, len(req.seq)) == len(prompt) + 3
    req.fixed_k = 2
    eng.step([req])
    assert eng.proposer.lag(0, len(req.seq)) <= 1  # caught up: at most the last accepted draft is unseen
    eng.free_row(0)
    eng.reset()


def test_the_cost_table_shows_the_draft_step_by_batch():
    from rich.console import Console

    from trtspec.cli.status import cost_table

    console = Console(record=True, width=120)
    console.print(cost_table(CostTable({1: 0.01}, {"draft-model": 0.002}, "test",
                                       {"draft-model": {4: 0.004}}).to_dict(), "costs"))
    text = console.export_text()
    assert "draft step, draft-model " in text and "draft step, draft-model, 4 requests" in text and "0.40" in text


def test_nodes_drafted_teach_the_rows_per_k():
    """An n-gram trie of several continuations verifies more rows than its depth: priced as verified."""
    price = Price(table({1: 1.0, 4: 1.0, 5: 3.0, 64: 40.0}, 0.0).verify_seconds, 0.0)
    chain, trie = AdaptiveK(CHAIN, AdaptiveConfig(), price), AdaptiveK(CHAIN, AdaptiveConfig(), price)
    for _ in range(4):
        chain.update(3, 3, 3, nodes=3)
        trie.update(3, 3, 3, nodes=9)  # three candidates per depth
    assert chain.width == 1.0 and trie.width == 3.0
    assert chain.next_k() == 3 and trie.next_k() == 1


def test_seeded_sampled_outputs_do_not_depend_on_the_load(fam):
    """With a table whose price makes K follow the batch strongly, a seeded sampled request's K (and so its
    random draws and its tokens) is priced at batch 1 whatever runs beside it; a greedy one's follows."""
    spec = load_spec(write_spec(fam, "draft-model", draft="draft_near", k=4, batch=4))
    eng = methods.engine(spec, costs=CostTable({1: 1.0, 5: 1.05, 6: 3.0, 64: 40.0}, {"*": 0.01}))
    sp = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5, end_id=-1)
    alone = eng.generate([0, 1, 2], sp)
    others = [[3 + i] * 4 for i in range(3)]
    res = eng.generate_batch([[0, 1, 2], *others], [sp] + [SamplingParams(max_new_tokens=24, end_id=-1)] * 3)
    assert (res[0].tokens, res[0].drafted) == (alone.tokens, alone.drafted)


def test_a_request_prices_its_k_at_the_batch_unless_seeded_and_sampled():
    price = Price(CostTable({1: 1.0, 5: 1.05, 6: 3.0, 64: 40.0}).verify_seconds, 0.01)
    assert chooser(price).choose_k(cap=4, batch=1) == 4
    assert chooser(price).choose_k(cap=4, batch=4) == 0  # 4 requests x 2 rows already cost 3x a decode step
    assert chooser(price, temperature=1.0).choose_k(cap=4, batch=4) == 0  # unseeded: its output may follow the load
    assert chooser(price, temperature=1.0, seed=1).choose_k(cap=1, batch=4) == 4  # seeded: priced at 1, never capped
