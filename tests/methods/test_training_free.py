"""The training-free drafters: Jacobi lookahead decoding (lookahead), prompt lookup (ngram) and
SuffixDecoding (suffix). Greedy identity and batching for each run in tests/runtime (test_engine's CASES,
test_batch_mixes' METHODS); here: the Jacobi window against a from-scratch recomputation, the lookahead mask,
lossless sampling through the lookahead step, the fallback that switches a branch off, the suffix trees, the
cross-request cache's bounds and isolation, and each method's TensorRT-LLM mapping or refusal."""

from __future__ import annotations

import pytest
import torch

from tests.runtime import family
from trtspec import methods
from trtspec.backends.trtllm_llmapi_methods import llmapi_method
from trtspec.check import spec_from_dict
from trtspec.errors import SpecError
from trtspec.methods.lookahead import (
    DEPRECATION,
    LookaheadProposer,
    Pool,
    column_ngrams,
    jacobi_step,
    lookahead_max_draft_len,
    window_shape,
)
from trtspec.methods.suffix import OutputCache, SuffixProposer, SuffixTree, speculate
from trtspec.runtime import AdaptiveConfig, Llama, SamplingParams, SpecEngine
from trtspec.runtime.cache import branch_inputs, chain_inputs
from trtspec.runtime.proposer import Branch

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def fam(tmp_path_factory):
    root = tmp_path_factory.mktemp("family")
    family.save_llama(root / "target", seed=1)
    family.save_tokenizer(root / "target")
    return root


@pytest.fixture(scope="module")
def target(fam):
    return Llama.from_dir(fam / "target")


def _argmax_after(target: Llama, seq: list[int]) -> int:
    """The target's greedy next token after `seq`, computed from scratch (a fresh cache, a causal chain)."""
    cache = target.new_cache(1, len(seq) + 1)
    inp = chain_inputs([0], len(seq))
    logits, _ = target.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([seq]))
    return int(logits[0, -1].argmax())


# ------------------------------------------------------------------------------------------ lookahead

def test_the_engine_max_draft_len_is_the_steps_inputs():
    """TensorRT-LLM's max_draft_len (N-2) + (W-1+G)(N-1) is exactly what one lookahead step adds after the
    pending token: the (N-1)W - 1 window cells and G n-grams of N - 1 tokens."""
    for W, N, G in [(4, 3, 4), (7, 7, 7), (2, 2, 1), (15, 5, 15), (1, 4, 2)]:
        prop = LookaheadProposer(W, N, G)
        assert len(window_shape(W, N)[0]) + G * (N - 1) == lookahead_max_draft_len(W, N, G) == prop.max_nodes(N - 1)


@pytest.mark.parametrize("W,N,G", [(4, 3, 4), (3, 4, 2), (3, 2, 2)])
def test_jacobi_window_update_equals_a_from_scratch_recomputation(fam, target, W, N, G):
    """Every step, the new last level the proposer takes from the one batched forward (KV cache, the
    lookahead + verification mask, verification candidates next to it) equals, column by column, the target's
    greedy token after that column's trajectory computed from scratch; the window moves as jacobi_step says;
    the pending token's output is the plain next token."""
    prop = LookaheadProposer(W, N, G)
    eng = SpecEngine(target, prop, max_batch_size=2, max_input_len=32, max_output_len=24,
                     num_draft_tokens=N - 1, adaptive=AdaptiveConfig(enabled=False))
    seen = []
    inner = prop.commit_branch

    def spy(outputs):
        st = prop.rows[0]
        seen.append((list(eng.scheduler.active[0].seq), [list(lv) for lv in st.levels], st.ran, outputs[0]))
        inner(outputs)
        seen[-1] += (prop.rows[0].levels,)

    prop.commit_branch = spy
    prompt = [5, 9, 13, 5, 9, 17, 21, 5, 9, 13]
    eng.generate(prompt, SamplingParams(max_new_tokens=16, end_id=-1))
    assert len(seen) >= 6
    for seq, levels, pending, out, after in seen:
        assert pending == seq[-1]
        assert out[0] == _argmax_after(target, seq)
        top = []
        for c in range(W):
            column = seq + levels[0][:c] + [lv[c] for lv in levels[1:]]
            top.append(_argmax_after(target, column))
        assert after == jacobi_step(levels, top)


def test_jacobi_step_and_column_ngrams():
    levels = [[11, 12], [20, 21, 22], [30, 31, 32]]  # W = 3, N = 4
    top = [40, 41, 42]
    assert jacobi_step(levels, top) == [[21, 22], [30, 31, 32], [40, 41, 42]]
    assert column_ngrams(7, levels, top) == [(7, (20, 30, 40)), (11, (21, 31, 41)), (12, (22, 32, 42))]
    assert jacobi_step([[1, 2]], [5, 6, 7]) == [[6, 7]]  # N = 2: level 0 only


def test_pool_is_lru_with_at_most_g_per_key():
    p = Pool(2)
    for tail in [(1, 2), (3, 4), (1, 2), (5, 6)]:
        p.add(9, tail)
    assert p.get(9) == [(5, 6), (1, 2)]  # (1, 2) was refreshed, (3, 4) the oldest dropped
    assert p.get(8) == []


def test_branch_mask_separates_the_two_branches():
    """One mask: draft nodes see their ancestors and the pending token, never the window; window cells see
    what they list (LADE's staircase) and never the nodes; everyone sees the committed slots."""
    depths, sees = window_shape(3, 3)  # level 0: columns 1, 2; level 1: columns 0..2
    assert depths == (1, 2, 1, 2, 3)
    br = Branch((50, 51, 60, 61, 62), depths, sees)
    inp = branch_inputs([4], [(-1, 0)], [br], T=8)
    m = inp.mask[0, 0, :, 4:]  # the step's own slots: pending, node 0, node 1, 5 window cells
    assert inp.positions[0].tolist() == [4, 5, 6, 5, 6, 5, 6, 7]
    assert bool(inp.mask[0, 0, :, :4].all())
    want = {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [0, 3], 4: [0, 3, 4], 5: [0, 5], 6: [0, 3, 6], 7: [0, 3, 4, 7]}
    for i, cols in want.items():
        assert torch.nonzero(m[i]).flatten().tolist() == cols, i


def test_sampled_lookahead_is_lossless_end_to_end(tmp_path):
    """Seeded requests through a step that runs both branches (candidates from the prompt's n-grams, tested
    as point masses next to the window): the two tokens after the prefill's follow the target's processed
    joint distribution (chi-square)."""
    from tests.runtime.test_engine import _first_tokens_exact
    from tests.runtime.test_rejection import chi2_z

    kw = dict(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, initializer_range=0.6, eos_token_id=None, bos_token_id=None)
    family.save_llama(tmp_path / "target", seed=21, **kw)
    prompt = [5, 6, 4, 3, 3, 1, 3, 3, 3, 4, 1, 1, 3]  # the model's own greedy text: its n-grams are often right
    sp = SamplingParams(max_new_tokens=3, temperature=1.0, num_draft_tokens=2)
    n = 12000
    eng = SpecEngine(Llama.from_dir(tmp_path / "target"), LookaheadProposer(3, 3, 3), num_draft_tokens=2,
                     max_batch_size=1000, max_input_len=16, max_output_len=8)
    res = eng.generate_batch([prompt] * n, [SamplingParams(**{**sp.__dict__, "seed": 1000 + i}) for i in range(n)])
    counts = torch.zeros(8, 8)
    for r in res:
        counts[r.tokens[1], r.tokens[2]] += 1
    accepted = sum(r.accepted for r in res)
    assert 0.3 * n < accepted < sum(r.drafted for r in res)  # both acceptances and rejections
    assert chi2_z(counts, _first_tokens_exact(eng.target, prompt, sp)) < 4.0


class _NoPool(LookaheadProposer):
    """A lookahead proposer whose pool never has candidates: every branch it runs is paid for and useless."""

    def _learn_seq(self, st, seq):
        st.seen = len(seq)

    def commit_branch(self, outputs):
        for st in self.rows:
            if st is not None:
                st.pool.map.clear()
        super().commit_branch(outputs)
        for st in self.rows:
            if st is not None:
                st.pool.map.clear()


def test_adaptive_fallback_switches_a_useless_lookahead_branch_off(target):
    """A branch costs its rows every step even when it proposes nothing, so such a step counts as a rejected
    draft: adaptive K falls back to plain decoding (no branch) and only probes now and then."""
    prop = _NoPool(4, 3, 4)
    eng = SpecEngine(target, prop, max_batch_size=1, max_input_len=32, max_output_len=64, num_draft_tokens=2,
                     adaptive=AdaptiveConfig(history=4, fallback_acceptance=0.2))
    ran = []
    inner = prop.propose

    def propose(batch):
        d = inner(batch)
        ran.append(d[0].branch is not None)
        return d

    prop.propose = propose
    res = eng.generate([3, 1, 4, 1, 5], SamplingParams(max_new_tokens=60, end_id=-1))
    assert res.drafted == 0 and len(ran) > 40
    assert sum(ran) < len(ran) / 2  # before the fix: the branch ran on every step


def test_lookahead_spec_maps_to_the_engine_and_is_refused_by_the_llmapi():
    rt = {"kind": "trtllm-llmapi", "device": "cuda"}
    with pytest.raises(SpecError) as err:
        spec_from_dict({"schema": 1, "model": {"target": "t"}, "speculative": {"method": "lookahead"},
                        "runtime": rt, "gpu": {"type": "h100"}})
    assert "LookaheadDecodingConfig runs on TensorRT engines only" in err.value.problems[0]
    assert "ngram" in err.value.problems[0]
    spec = spec_from_dict({"schema": 1, "model": {"target": "t"},
                           "speculative": {"method": "lookahead", "lookahead": {"window": 5, "ngram": 4,
                                                                                 "verification_set": 3}},
                           "runtime": {"kind": "trtllm-engine", "device": "cuda"}, "gpu": {"type": "h100"}})
    from trtspec.backends.trtllm_engine_methods import engine_method

    m, engine = methods.get("lookahead"), engine_method(spec)
    assert engine.max_draft_len(spec) == 2 + 7 * 3
    assert engine.backend_parameters(spec, "target") == {"lookahead_window_size": "5", "lookahead_ngram_size": "4",
                                                         "lookahead_verification_set_size": "3"}
    assert m.notes(spec) == [DEPRECATION]


# ------------------------------------------------------------------------------------------ ngram

def test_ngram_maps_to_the_llmapi_ngram_and_is_refused_by_the_engine():
    base = {"schema": 1, "model": {"target": "t"}, "gpu": {"type": "h100"},
            "speculative": {"method": "ngram", "num_draft_tokens": 5, "ngram": {"max_matching": 2}}}
    spec = spec_from_dict(base | {"runtime": {"kind": "trtllm-llmapi", "device": "cuda"}})
    assert llmapi_method(spec).options(spec) == {"speculative_config": {
        "decoding_type": "NGram", "max_draft_len": 5, "max_matching_ngram_size": 2, "is_keep_all": True,
        "is_use_oldest": True, "is_public_pool": True}}
    with pytest.raises(SpecError, match="TensorRT-LLM engines have no prompt-lookup mode"):
        spec_from_dict(base | {"runtime": {"kind": "trtllm-engine", "device": "cuda"}})


def test_an_ngram_min_matching_longer_than_its_max_is_named():
    with pytest.raises(SpecError) as err:
        spec_from_dict({"schema": 1, "model": {"target": "t"}, "gpu": {"type": "cpu"},
                        "runtime": {"kind": "torch", "device": "cpu"},
                        "speculative": {"method": "ngram", "ngram": {"max_matching": 2, "min_matching": 3}}})
    assert any(p.startswith("speculative.ngram.min_matching = 3: the shortest match must not be longer than the "
                            "longest (2)") for p in err.value.problems)


# ------------------------------------------------------------------------------------------ suffix

def test_suffix_tree_counts_and_speculation():
    t = SuffixTree(depth=4)
    active = t.extend(t.open(), [1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert t.find([1, 2]).count == 3 and t.find([1, 2, 3]).count == 2 and t.find([2, 4]).count == 1
    assert t.find([1, 2, 3, 1, 2]) is None  # deeper than the tree
    assert len(active) == 5  # the suffixes of lengths 0..4 that end the sequence
    # m = 2 ([1, 2]: 3 follows twice, 4 once; then [1, 2, 3] is followed by 1 once) beats m = 1 ([2] -> 3, one
    # token at factor 1): the path's probabilities 2/3 and 2/3 * 1/2 sum to the higher score
    score, toks = speculate(t, [9, 1, 2], k=8, factor=1.0, offset=0.0, min_prob=0.1)
    assert toks == [3, 1] and score == pytest.approx(2 / 3 + 1 / 3)
    assert speculate(t, [9, 1, 2], k=8, factor=1.0, offset=0.0, min_prob=0.5)[1] == [3]
    t.remove([1, 2, 3, 1, 2, 4, 1, 2, 3])
    assert t.root.kids == {}


def test_suffix_cache_is_bounded_fifo():
    c = OutputCache(depth=8, max_requests=2, max_tokens=10)
    for out in ([1, 2, 3], [4, 5, 6], [7, 8, 9]):
        c.add(out)
    assert list(c.outputs) == [[4, 5, 6], [7, 8, 9]] and c.tokens == 6
    assert c.tree.find([1]) is None and c.tree.find([4, 5]).count == 1
    c.add(list(range(20, 29)))  # 9 tokens: over 10 with anything else
    assert list(c.outputs) == [list(range(20, 29))] and c.tokens == 9
    assert set(c.tree.root.kids) == set(range(20, 29))
    c.add(list(range(30, 50)))  # longer than the bound: its last 10 tokens
    assert list(c.outputs) == [list(range(40, 50))] and c.tokens == 10
    off = OutputCache(depth=8, max_requests=0, max_tokens=10)
    off.add([1, 2])
    assert not off.outputs and off.tree.root.kids == {}


def _drafts(eng, prompt, n=24):
    got = []
    inner = eng.proposer.propose

    def spy(batch):
        d = inner(batch)
        got.append([x.tokens for x in d])
        return d

    eng.proposer.propose = spy
    try:
        res = eng.generate(prompt, SamplingParams(max_new_tokens=n, end_id=-1))
    finally:
        eng.proposer.propose = inner
    return res.tokens, got


def test_suffix_cache_is_off_by_default_and_keeps_requests_apart(target, fam):
    """Off by default: request B drafts exactly what it drafts on a fresh engine, whatever ran before it. On:
    a request repeating A's prompt drafts from A's output at once (the positive control)."""
    spec = spec_from_dict({"schema": 1, "model": {"target": str(fam / "target")},
                           "speculative": {"method": "suffix", "num_draft_tokens": 8}})
    assert spec.speculative.suffix.cache_requests == 0
    a, b = [7, 3, 7, 3, 9, 11, 2], [40, 41, 42, 43]

    def new(cache: int):
        return SpecEngine(target, SuffixProposer(cache_requests=cache), max_batch_size=2, max_input_len=16,
                          max_output_len=32, num_draft_tokens=8, adaptive=AdaptiveConfig(enabled=False))

    fresh_b = _drafts(new(0), b)
    shared = new(0)
    _drafts(shared, a)
    assert _drafts(shared, b) == fresh_b
    assert shared.proposer.cache is None
    on = new(100)
    first_a = _drafts(on, a)
    again = _drafts(on, a)
    assert again[0] == first_a[0]  # outputs stay exact
    assert sum(map(len, sum(again[1], []))) > sum(map(len, sum(first_a[1], [])))
    assert list(on.proposer.cache.outputs)[0] == first_a[0]


def test_suffix_llmapi_sa_by_version_and_engine_refusal():
    def spec(kind: str, version: str = "1.2.1", cache: int = 0):
        return spec_from_dict({"schema": 1, "model": {"target": "t"}, "gpu": {"type": "h100"},
                               "speculative": {"method": "suffix", "num_draft_tokens": 6,
                                               "suffix": {"cache_requests": cache}},
                               "runtime": {"kind": kind, "device": "cuda",
                                           "trtllm": {"version": version, "image": f"example.org/trtllm:{version}"}}})

    with pytest.raises(SpecError, match=r"TensorRT-LLM 1\.2\.1 has no SA \(suffix automaton\)"):
        spec("trtllm-llmapi")
    probe = spec("trtllm-llmapi", "1.3.0rc27", cache=10)
    got = llmapi_method(probe).options(probe)
    assert got == {"speculative_config": {"decoding_type": "SA", "max_draft_len": 6, "max_matching_ngram_size": -1,
                                          "enable_global_pool": True}}
    with pytest.raises(SpecError, match="TensorRT-LLM engines have no suffix decoding"):
        spec("trtllm-engine")
    on = spec_from_dict({"schema": 1, "model": {"target": "t"},
                         "speculative": {"method": "suffix", "suffix": {"cache_requests": 5}}})
    assert "another user's request" in methods.get("suffix").notes(on)[0]
