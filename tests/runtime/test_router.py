"""Per-request draft routing (runtime/router.py): the classifier, the router's choice, and the composite proposer —
a routed request decodes exactly as it does on an engine with its drafter alone (greedy and seeded sampled, in any
batch mix, rows refilled and moved), and sampled routed decoding follows the target's distribution (chi-square)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from transformers import AutoTokenizer

from tests.runtime.family import VOCAB
from tests.runtime.test_batch_mixes import MAX_NEW, ROWS, TREE, staggered
from trtspec.bench.prompts import CHAT, CODE, EDIT
from trtspec.errors import GenerationError
from trtspec.methods.draft_model import DraftModelProposer
from trtspec.methods.eagle import EagleProposer
from trtspec.methods.ngram import NgramProposer
from trtspec.runtime import AdaptiveConfig, Llama, SamplingParams, SpecEngine
from trtspec.runtime.router import RoutedProposer, Router, classify

# ------------------------------------------------------------------------------------------ the classifier


def test_classifier_splits_code_and_edits_from_prose():
    assert [classify(p) for p in CODE + EDIT] == ["code"] * (len(CODE) + len(EDIT))
    assert [classify(p) for p in CHAT] == ["prose"] * len(CHAT)
    # a request for code written in prose, a sentence with a parenthesis, nothing at all: prose
    for text in ("Write a Python function that checks whether a number is prime.",
                 "Print the whole class list (every name) for the teacher.", "", "   \n"):
        assert classify(text) == "prose", text
    assert classify("x = [f(a) for a in xs if a != None]") == "code"


def test_router_picks_by_task_then_by_kind():
    names = ["prose", "code", "plain"]
    r = Router("classify", "prose", {"code": "code", "prose": "prose", "chat": "prose"}, names)
    assert r.choose("plain", CODE[0]) == 2  # a drafter's name wins over the classifier
    assert r.choose("chat") == 0            # a route key
    assert r.choose(None, CODE[0]) == 1 and r.choose(None, lambda: CHAT[0]) == 0
    with pytest.raises(GenerationError, match="unknown task 'cod'") as e:
        r.choose("cod", CODE[0])
    assert "chat, code, plain, prose" in e.value.hint
    by_task = Router("task", "plain", {"code": "code"}, names)
    assert by_task.choose(None, CODE[0]) == 2 and by_task.choose("code") == 1  # kind task: no classifier
    no_prose = Router("classify", "plain", {"code": "code"}, names)
    assert no_prose.choose(None, CHAT[0]) == 2  # a class without a route: the default


# ------------------------------------------------------------------------------------------ the engine

DRAFTERS = {  # name -> (proposer, K): a sampled chain, deterministic candidates, and a tree (not K-as-depth)
    "near": (lambda root: DraftModelProposer(root / "draft_near"), 4),
    "ngram": (lambda root: NgramProposer(3, 4), 4),
    "tree": (lambda root: EagleProposer(root / "eagle", TREE), 6),
}


@pytest.fixture(scope="module")
def routed(fam):
    """A routed engine over DRAFTERS (kind task, default near) and one engine per drafter alone, on one target."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRTSPEC_DRAFT_DTYPE", "float32")
    tok = AutoTokenizer.from_pretrained(str(fam / "target"))
    target = Llama.from_dir(fam / "target")
    kw = dict(max_batch_size=ROWS, max_input_len=24, max_output_len=MAX_NEW,
              adaptive=AdaptiveConfig(history=2, fallback_acceptance=0.5))
    subs = [(name, make(fam), k, name) for name, (make, k) in DRAFTERS.items()]
    eng = SpecEngine(target, RoutedProposer(subs, Router("task", "near", {}, list(DRAFTERS))), tok,
                     num_draft_tokens=6, **kw)
    alone = {name: SpecEngine(Llama.from_dir(fam / "target"), make(fam), tok, num_draft_tokens=k, **kw)
             for name, (make, k) in DRAFTERS.items()}
    yield eng, alone
    for e in [eng, *alone.values()]:
        e.close()
    mp.undo()


class _Tasked:
    """stream((prompt, task), sp) for test_batch_mixes.staggered, which streams (prompt, sp)."""

    def __init__(self, eng):
        self.eng = eng

    def stream(self, pt, sp):
        return self.eng.stream(pt[0], sp, pt[1])


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_a_routed_request_decodes_as_on_its_drafter_alone(routed, data):
    """Any mix of tasks, K, greedy and seeded sampling, batched and arriving at drawn steps with rows refilled:
    each request's tokens are those of an engine with its drafter alone (whose outputs the other tests prove
    lossless), and greedy ones those of plain decoding."""
    eng, alone = routed
    n = data.draw(st.integers(2, 6), label="requests")
    tasks = data.draw(st.lists(st.sampled_from([*DRAFTERS, None]), min_size=n, max_size=n), label="tasks")
    prompts, sps = [], []
    for task in tasks:
        prompts.append(data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20)))
        k = data.draw(st.sampled_from([None, 0, 1, 2, 4]))
        sp = SamplingParams(max_new_tokens=data.draw(st.integers(1, MAX_NEW)), num_draft_tokens=k, end_id=-1)
        if data.draw(st.booleans()):
            sp = dataclasses.replace(sp, temperature=data.draw(st.floats(0.3, 2.0)),
                                     seed=data.draw(st.integers(0, 2**64 - 1)))
        sps.append(sp)
    want = [alone[t or "near"].generate(p, sp).tokens for p, sp, t in zip(prompts, sps, tasks)]
    assert [r.tokens for r in eng.generate_batch(prompts, sps, tasks)] == want
    assert [tokens for tokens, _, _ in staggered(_Tasked(eng), list(zip(prompts, tasks)), sps,
                                                 data.draw(st.lists(st.integers(0, 4),
                                                                    min_size=n, max_size=n)))] == want
    for p, sp, w in zip(prompts, sps, want):
        if sp.greedy:
            assert w == alone["near"].generate(p, dataclasses.replace(sp, num_draft_tokens=0)).tokens
    assert eng.num_active == 0 and not eng.proposer.route and not any(eng.proposer.rows)


def test_routed_steps_count_each_request_on_its_drafter(routed):
    eng, _ = routed
    seen = []
    eng.on_step.append(seen.append)
    try:
        eng.generate_batch([[1, 2, 3, 1, 2, 3]] * 3, SamplingParams(max_new_tokens=6, end_id=-1),
                           ["ngram", "tree", None])
    finally:
        eng.on_step.remove(seen.append)
    assert eng.drafter_names == list(DRAFTERS)
    assert seen[0].drafters == [1, 2, 0]  # row b's drafter, in the order the requests came
    assert all(len(s.drafters) == s.batch_size for s in seen)


def test_an_engine_without_routing_ignores_the_task(fam):
    from tests.runtime.family import engine

    eng = engine(fam, "ngram")
    assert eng.route([1, 2, 3], "anything") == 0 and not eng.routed
    assert eng.generate([1, 2, 3], SamplingParams(max_new_tokens=4), task="anything").tokens


def test_sampled_routed_decoding_is_lossless(tmp_path):
    """Seeded requests, half on a sampled draft model (its own q), half on n-gram candidates (point masses),
    in the same batches: the two tokens after the prefill's follow the target's processed joint distribution."""
    from tests.runtime import family
    from tests.runtime.test_engine import _first_tokens_exact
    from tests.runtime.test_rejection import chi2_z

    kw = dict(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, initializer_range=0.6, eos_token_id=None, bos_token_id=None)
    family.save_llama(tmp_path / "target", seed=21, **kw)
    family.save_noisy_copy(tmp_path / "target", tmp_path / "draft", noise=0.6, seed=22)
    subs = [("draft", DraftModelProposer(tmp_path / "draft"), 2, "draft-model"),
            ("ngram", NgramProposer(2, 2), 2, "ngram")]
    eng = SpecEngine(Llama.from_dir(tmp_path / "target"),
                     RoutedProposer(subs, Router("task", "draft", {}, ["draft", "ngram"])),
                     num_draft_tokens=2, max_batch_size=1000, max_input_len=8, max_output_len=8)
    prompt = [1, 2, 1, 2, 1, 2, 1]  # n-grams that match: the ngram rows draft too
    sp = SamplingParams(max_new_tokens=3, temperature=0.9, top_k=6, num_draft_tokens=2)
    n = 16000
    tasks = ["draft", "ngram"] * (n // 2)
    res = eng.generate_batch([prompt] * n, [dataclasses.replace(sp, seed=1000 + i) for i in range(n)], tasks)
    exact = _first_tokens_exact(eng.target, prompt, sp)
    for half in ("draft", "ngram"):
        rs = [r for r, t in zip(res, tasks) if t == half]
        counts = torch.zeros(8, 8)
        for r in rs:
            counts[r.tokens[1], r.tokens[2]] += 1
        assert 0 < sum(r.accepted for r in rs) < sum(r.drafted for r in rs)  # acceptances and rejections
        assert chi2_z(counts, exact) < 4.0, half
