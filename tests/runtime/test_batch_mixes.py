"""Any mix of requests batches: every method, with any mix of K, sampling settings, stop strings, end ids and
lengths, gives each request exactly what it gets alone (greedy rows token-identical, seeded sampled rows too:
a request's random stream does not depend on the batch), through generate_batch and through streams that
arrive at drawn steps, with fewer rows than requests so that rows are refilled. (submit() runs the same ticks on
the scheduler thread, whose arrival timing is not deterministic: test_engine covers it.)"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from transformers import AutoTokenizer

from tests.runtime.family import VOCAB, engine
from trtspec.methods.draft_model import DraftModelProposer
from trtspec.methods.eagle import EagleProposer
from trtspec.methods.lookahead import LookaheadProposer
from trtspec.methods.medusa import MedusaProposer
from trtspec.methods.ngram import NgramProposer
from trtspec.methods.suffix import SuffixProposer
from trtspec.runtime import AdaptiveConfig, Llama, Proposer, SamplingParams, SpecEngine


def test_draft_model_row_moved_during_a_step_without_drafts(fam):
    """Issue #3: A (long prompt, drafting) ends and B (K = 0) moves into its row; steps where no row drafts
    must not commit A's stale draft-cache length onto B, else B's next drafting step reads past its sequence
    (`index -1 is out of bounds`) and fails every request of the batch."""
    eng = engine(fam, "draft-model", batch=2)
    a = [5 + i % 80 for i in range(50)]
    sp_b = SamplingParams(max_new_tokens=20, num_draft_tokens=0, end_id=-1)
    sp_c = SamplingParams(max_new_tokens=8, num_draft_tokens=4, end_id=-1)
    alone_b = eng.generate([3, 4], sp_b).tokens
    alone_c = eng.generate([7, 8, 9], sp_c).tokens
    ia = eng.stream(a, SamplingParams(max_new_tokens=3, num_draft_tokens=4, end_id=-1))
    ib = eng.stream([3, 4], sp_b)
    next(ia)  # A prefilled into row 0
    got_b = next(ib).tokens  # B joins row 1; A drafts, ends and frees row 0: B moves there
    assert list(ia)[-1].finished
    for _ in range(3):  # B alone, not drafting
        got_b += next(ib).tokens
    got_c = [t for ev in eng.stream([7, 8, 9], sp_c) for t in ev.tokens]  # C drafts next to B
    got_b += [t for ev in ib for t in ev.tokens]
    assert (got_b, got_c) == (alone_b, alone_c)


# ------------------------------------------------------------------------------------------ property test

TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]
# method -> (proposer, K); `draft` is an independent random LM (rejected: adaptive K falls back and probes),
# `draft_near` a noisy copy of the target (accepted: long kept paths)
METHODS = {
    "none": (lambda root: Proposer(), 0),
    "draft-model": (lambda root: DraftModelProposer(root / "draft"), 4),
    "draft-model-near": (lambda root: DraftModelProposer(root / "draft_near"), 4),
    "medusa-chain": (lambda root: MedusaProposer(root / "medusa"), 3),
    "medusa-tree": (lambda root: MedusaProposer(root / "medusa", TREE), 6),
    "eagle-chain": (lambda root: EagleProposer(root / "eagle"), 4),
    "eagle-tree": (lambda root: EagleProposer(root / "eagle", TREE), 6),
    "lookahead": (lambda root: LookaheadProposer(4, 3, 4), 4),
    "ngram": (lambda root: NgramProposer(3, 4), 4),
    "suffix": (lambda root: SuffixProposer(), 6),
}
MAX_NEW = 12
ROWS = 3  # < the largest batch drawn: rows get refilled


@pytest.fixture(scope="module")
def engines(fam):
    """One engine per method, built on first use. Float32 drafters (bf16 GEMMs of one row and of several round
    differently, which can move a sample across a bucket edge: exact either way, but not the same sample).
    A short adaptive history so that fallback and probes happen within a few steps."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRTSPEC_DRAFT_DTYPE", "float32")
    tok = AutoTokenizer.from_pretrained(str(fam / "target"))
    built: dict[str, SpecEngine] = {}

    def get(method: str) -> SpecEngine:
        if method not in built:
            make, k = METHODS[method]
            built[method] = SpecEngine(Llama.from_dir(fam / "target"), make(fam), tok, max_batch_size=ROWS,
                                       max_input_len=24, max_output_len=MAX_NEW, num_draft_tokens=k,
                                       adaptive=AdaptiveConfig(history=2, fallback_acceptance=0.5))
        return built[method]

    yield get
    for eng in built.values():
        eng.close()
    mp.undo()


@st.composite
def requests(draw, k_max: int):
    """(prompt, SamplingParams without stop/end_id, how to pick end_id, stop windows) of one request."""
    prompt = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20))
    k = draw(st.sampled_from([None, 0, *range(1, k_max + 1)]))
    sp = SamplingParams(max_new_tokens=draw(st.integers(1, MAX_NEW)), num_draft_tokens=k)
    if draw(st.booleans()):
        sp = dataclasses.replace(sp, temperature=draw(st.floats(0.3, 2.0)), top_k=draw(st.sampled_from([0, 3, 20])),
                                 top_p=draw(st.sampled_from([1.0, 0.9, 0.5])), seed=draw(st.integers(0, 2**64 - 1)))
    end = draw(st.sampled_from(["model", "none", "output"]))
    stops = draw(st.lists(st.tuples(st.integers(0, MAX_NEW - 1), st.integers(1, 2)), max_size=2))
    return prompt, sp, end, stops


def concretize(eng: SpecEngine, prompt, sp: SamplingParams, end: str, stops, pick) -> SamplingParams:
    """End id and stop strings from what this request produces alone (so that they sometimes hit)."""
    out = eng.generate(prompt, dataclasses.replace(sp, end_id=-1)).tokens
    end_id = None if end == "model" else -1 if end == "none" else out[pick(len(out))]
    stop = tuple(s for s in (eng.tokenizer.decode(out[i % len(out):i % len(out) + w]) for i, w in stops) if s)
    return dataclasses.replace(sp, end_id=end_id, stop=stop)


def staggered(eng: SpecEngine, prompts, sps, gaps) -> list[tuple[list[int], str, str | None]]:
    """(tokens, text, finish_reason) of each request when request i arrives `gaps[i]` steps after the one
    before it: stream generators driven in turn (no scheduler thread, so arrivals are deterministic), rows
    refilled at any point of the others' runs."""
    its = [eng.stream(p, sp) for p, sp in zip(prompts, sps)]
    events: list[list] = [[] for _ in its]
    live: list[int] = []

    def pull(i: int) -> None:  # drives ticks until request i has its next event
        ev = next(its[i])
        events[i].append(ev)
        if ev.finished:
            live.remove(i)
            assert next(its[i], None) is None  # ends the generator (raises the request's error, if any)

    for i, gap in enumerate(gaps):
        live.append(i)
        pull(i)
        for _ in range(gap):
            if live:
                pull(live[0])
    while live:
        pull(live[0])
    return [([t for ev in evs for t in ev.tokens], "".join(ev.text for ev in evs), evs[-1].finish_reason)
            for evs in events]


@pytest.mark.parametrize("method", list(METHODS))
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_any_mix_batches_like_requests_alone(engines, method, data):
    eng = engines(method)
    reqs = data.draw(st.lists(requests(eng.k_max), min_size=2, max_size=6), label="requests")
    gaps = data.draw(st.lists(st.integers(0, 4), min_size=len(reqs), max_size=len(reqs)), label="arrival gaps")
    pick = lambda n: data.draw(st.integers(0, n - 1), label="end_id at")  # noqa: E731
    prompts = [p for p, *_ in reqs]
    sps = [concretize(eng, p, sp, end, stops, pick) for p, sp, end, stops in reqs]
    alone = [eng.generate(p, sp) for p, sp in zip(prompts, sps)]
    want = [(r.tokens, r.text, r.finish_reason) for r in alone]
    batched = eng.generate_batch(prompts, sps)
    assert [(r.tokens, r.text, r.finish_reason) for r in batched] == want
    assert staggered(eng, prompts, sps, gaps) == want
    assert eng.num_active == eng.num_waiting == 0


def test_seeded_sampling_does_not_depend_on_the_load(fam, monkeypatch):
    """Adaptive K is capped by the load (load_cap) for greedy and unseeded requests only: a seeded sampled
    request's K decides how many of its random numbers each step draws, so it gives the same tokens next to
    three other requests as alone."""
    monkeypatch.setenv("TRTSPEC_DRAFT_DTYPE", "float32")
    eng = engine(fam, "medusa", k=3, batch=4)
    sp = SamplingParams(max_new_tokens=24, temperature=1.0, seed=5, end_id=-1)
    alone = eng.generate([0, 1, 2], sp).tokens
    others = [[3 + i] * 4 for i in range(3)]
    res = eng.generate_batch([[0, 1, 2], *others], [sp] + [SamplingParams(max_new_tokens=24, end_id=-1)] * 3)
    assert res[0].tokens == alone
