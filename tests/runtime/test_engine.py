"""SpecEngine: greedy identity for every drafter (batch 1 and 4, vs plain decoding and vs transformers),
losslessness of sampled draft-target decoding end to end, batching, submit(), stops and validation."""

from __future__ import annotations

import threading

import pytest
import torch

from tests.runtime import family
from tests.runtime.family import VOCAB, engine
from trtspec.errors import GenerationError
from trtspec.runtime import Draft, DraftPlan, Proposer, SamplingParams, SpecEngine
from trtspec.runtime.adaptive import AdaptiveConfig, AdaptiveK, best_option, load_cap, nominal
from trtspec.runtime.llama import Llama

N_NEW = 40
TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def make_prompts(n: int, seed: int, vocab: int = VOCAB) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 30, (n,), generator=g).tolist()
    return [torch.randint(1, vocab - 1, (m,), generator=g).tolist() for m in lengths]


def hf_greedy(model, prompt: list[int], n: int, eos: int | None) -> list[int]:
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, eos_token_id=eos, pad_token_id=0)[0, len(prompt):].tolist()
    return out[: out.index(eos) + 1] if eos is not None and eos in out else out


@pytest.fixture(scope="module")
def prompts():
    return make_prompts(8, seed=0)


@pytest.fixture(scope="module")
def reference(hf_target, prompts):
    """transformers' greedy continuations (stopping at the config's EOS like the engine does)."""
    return [hf_greedy(hf_target, p, N_NEW, family.EOS) for p in prompts]


@pytest.fixture(scope="module")
def plain(fam, prompts):
    eng = engine(fam, "none")
    return [eng.generate(p, SamplingParams(max_new_tokens=N_NEW)).tokens for p in prompts]


CASES = {
    "none": dict(method="none"),
    "draft-model": dict(method="draft-model"),
    "draft-model-near": dict(method="draft-model", draft="draft_near"),
    "medusa-chain": dict(method="medusa", k=3),
    "medusa-tree": dict(method="medusa", k=6, choices=TREE),
    "eagle-chain": dict(method="eagle", k=4),
    "eagle-tree": dict(method="eagle", k=6, choices=TREE),
    "lookahead": dict(method="lookahead", k=4),
    "ngram": dict(method="ngram", k=4),
    "suffix": dict(method="suffix", k=8),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_identity_every_method_batch_1_and_4(fam, prompts, reference, plain, case):
    eng = engine(fam, **CASES[case], batch=4)
    assert eng.method == CASES[case]["method"]
    assert plain == reference
    for k in (None, eng.k_max):  # adaptive K (may fall back to plain), and a fixed K (always drafts)
        sp = SamplingParams(max_new_tokens=N_NEW, num_draft_tokens=k)
        single = [eng.generate(p, sp) for p in prompts]
        assert [r.tokens for r in single] == reference, (case, k)
        batched = eng.generate_batch(prompts, sp)  # 8 prompts through 4 rows: rows refill as requests end
        assert [r.tokens for r in batched] == reference, (case, k)
        if case != "none" and k:
            assert sum(r.drafted for r in single) > 0


def test_drafters_that_agree_are_accepted(fam, prompts, reference):
    """A near-copy draft is mostly accepted, so identity above was exercised with real acceptance."""
    eng = engine(fam, "draft-model", draft="draft_near")
    res = eng.generate_batch(prompts, SamplingParams(max_new_tokens=N_NEW, num_draft_tokens=4))
    acc = sum(r.accepted for r in res) / sum(r.drafted for r in res)
    assert acc > 0.5
    assert sum(len(r.tokens) - 1 for r in res) / sum(r.steps for r in res) > 2.0


def test_eagle_head_wired_like_its_target_is_accepted(tmp_path):
    """An EAGLE head built to reproduce a 1-layer target (family.save_eagle_oracle; ~0.77 per-token agreement
    since it never sees token 0) is accepted as a chain and as a tree, while random heads are not."""
    from transformers import LlamaForCausalLM

    tdir, edir = family.save_eagle_oracle(tmp_path)
    hf = LlamaForCausalLM.from_pretrained(tdir).eval()
    ps = make_prompts(4, seed=3)
    ref = [hf_greedy(hf, p, N_NEW, None) for p in ps]
    for kw in (dict(k=4), dict(k=6, choices=TREE)):
        eng = engine(tmp_path, "eagle", target="target1", heads="eagle_oracle", **kw)
        res = eng.generate_batch(ps, SamplingParams(max_new_tokens=N_NEW, end_id=-1))
        assert [r.tokens for r in res] == ref
        depth_accepted = sum(r.accepted for r in res) / sum(r.steps for r in res)
        assert depth_accepted > 1.2, kw  # random heads: ~0


class OracleTree(Proposer):
    """Trees that hide the true greedy continuation among decoys, at a different sibling rank per depth, and
    break it at a varying depth: exercises tree masks, partial paths and the KV compaction of non-first nodes."""

    name = "oracle"

    def __init__(self, truth: dict[tuple[int, ...], list[int]]):
        self.truth = truth
        self.calls = 0

    def setup(self, target, max_batch, max_seq, k):
        return DraftPlan.chain(k)

    def max_nodes(self, k):
        return 3 * k

    def propose(self, batch):
        out = []
        for seq, k in zip(batch.seqs, batch.ks):
            self.calls += 1
            prompt = max((p for p in self.truth if tuple(seq[:len(p)]) == p), key=len)
            done = len(seq) - len(prompt)
            true = self.truth[prompt][done:done + k]
            cut = self.calls % (k + 1)  # depth where the truth is replaced by a decoy
            tokens, parents, at = [], [], -1
            for d, t in enumerate(true):
                t = (t + 7) % VOCAB if d == cut else t
                decoy = (t + 1 + d) % VOCAB
                pair = [(decoy, False), (t, True)] if (d + self.calls) % 2 else [(t, True), (decoy, False)]
                nxt = at
                for tok, real in pair:
                    tokens.append(tok)
                    parents.append(at)
                    if real:
                        nxt = len(tokens) - 1
                    else:  # a decoy child under the decoy
                        tokens.append((tok + 3) % VOCAB)
                        parents.append(len(tokens) - 2)
                at = nxt
            out.append(Draft(tokens, tuple(parents)) if k else Draft([], ()))
        return out


def test_tree_verification_with_non_contiguous_paths(fam, prompts, reference):
    truth = {tuple(p): r + [0] * 8 for p, r in zip(prompts, reference)}
    for batch in (1, 4):
        eng = SpecEngine(Llama.from_dir(fam / "target"), OracleTree(truth), num_draft_tokens=4, max_batch_size=batch,
                         max_input_len=64, max_output_len=64)
        res = eng.generate_batch(prompts, SamplingParams(max_new_tokens=N_NEW, num_draft_tokens=4))
        assert [r.tokens for r in res] == reference
        assert sum(r.accepted for r in res) / sum(r.steps for r in res) > 1.5


# ------------------------------------------------------------------------------------ sampling, end to end

@pytest.fixture(scope="module")
def tiny_vocab(tmp_path_factory):
    """A vocab-8 target and a vocab-8 draft that is a very noisy copy of it (so both acceptances and
    rejections are common)."""
    root = tmp_path_factory.mktemp("v8")
    kw = dict(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, initializer_range=0.6, eos_token_id=None, bos_token_id=None)
    family.save_llama(root / "target", seed=21, **kw)
    family.save_noisy_copy(root / "target", root / "draft", noise=0.6, seed=22)
    return root


def _first_tokens_exact(target: Llama, prompt: list[int], sp: SamplingParams) -> torch.Tensor:
    """P(y1, y2) of the tokens after the prefill's y0, from the target's processed distributions."""
    from trtspec.runtime.cache import chain_inputs
    from trtspec.runtime.sampling import processed_probs

    def dist(seq):
        cache = target.new_cache(1, 32)
        inp = chain_inputs([0], len(seq))
        lg, _ = target.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([seq]))
        return processed_probs(lg[0, -1], sp).double()

    out = torch.zeros(8, 8, dtype=torch.float64)
    p0 = dist(prompt)
    for y0 in range(8):
        p1 = dist(prompt + [y0])
        for y1 in range(8):
            out[y1] += p0[y0] * p1[y1] * dist(prompt + [y0, y1])
    return out


def _sampled_counts(root, n: int, sp: SamplingParams, prompt: list[int], proposer=None):
    from trtspec.methods.draft_model import DraftModelProposer

    proposer = proposer or DraftModelProposer(root / "draft")
    eng = SpecEngine(Llama.from_dir(root / "target"), proposer, num_draft_tokens=proposer_k(proposer),
                     max_batch_size=1024, max_input_len=8, max_output_len=8)
    res = eng.generate_batch([prompt] * n, [SamplingParams(**{**sp.__dict__, "seed": 1000 + i}) for i in range(n)])
    counts = torch.zeros(8, 8)
    for r in res:
        counts[r.tokens[1], r.tokens[2]] += 1
    return counts, eng, res


def proposer_k(proposer) -> int:
    return len(proposer.choices) if getattr(proposer, "choices", None) else 2


def test_sampled_draft_model_is_lossless_end_to_end(tiny_vocab):
    """20k seeded requests: the first two speculative tokens (one K=2 step) follow the target's processed joint
    distribution (chi-square), with top-k/temperature applied to both p and q."""
    from test_rejection import chi2_z

    sp = SamplingParams(max_new_tokens=3, temperature=0.9, top_k=6, num_draft_tokens=2)
    prompt = [1, 2, 3]  # max_new_tokens 3: the step after the prefill drafts K = 2 and emits tokens 1 and 2
    counts, eng, res = _sampled_counts(tiny_vocab, 20000, sp, prompt)
    exact = _first_tokens_exact(eng.target, prompt, sp)
    acc = sum(r.accepted for r in res) / sum(r.drafted for r in res)
    assert 0.2 < acc < 0.9  # rejections and acceptances both happen
    assert chi2_z(counts, exact) < 4.0


def test_sampled_end_to_end_check_catches_a_broken_residual(tiny_vocab, monkeypatch):
    from test_rejection import chi2_z

    from trtspec.runtime import rejection

    monkeypatch.setattr(rejection, "residual", lambda p, q: p)
    sp = SamplingParams(max_new_tokens=3, temperature=0.9, top_k=6, num_draft_tokens=2)
    counts, eng, _ = _sampled_counts(tiny_vocab, 20000, sp, [1, 2, 3])
    assert chi2_z(counts, _first_tokens_exact(eng.target, [1, 2, 3], sp)) > 8.0


def test_sampled_medusa_tree_is_lossless_end_to_end(tiny_vocab):
    """Tree of deterministic candidates (point masses, siblings tested against the running residual)."""
    from test_rejection import chi2_z

    from trtspec.methods.medusa import MedusaProposer

    family.save_medusa(tiny_vocab / "medusa", heads=2, hidden=16, vocab=8, seed=5, scale=1.0)
    tree = [[0], [1], [2], [0, 0], [0, 1], [1, 0]]
    sp = SamplingParams(max_new_tokens=3, temperature=1.0, top_p=0.95, num_draft_tokens=6)
    counts, eng, res = _sampled_counts(tiny_vocab, 20000, sp, [4, 1], MedusaProposer(tiny_vocab / "medusa", tree))
    assert sum(r.accepted for r in res) > 5000  # candidates are often right
    assert chi2_z(counts, _first_tokens_exact(eng.target, [4, 1], sp)) < 4.0


def test_sampled_batched_equals_single_with_seeds(fam, prompts, monkeypatch):
    """Seeded sampling does not depend on the batch: each request draws from its own generator, exactly as
    many numbers per step as its own K needs. (With bf16 drafter weights, batched and single GEMMs round
    differently, which can move a draft sample across a bucket edge: both outputs are exact samples, but not
    the same one. So this runs the drafter in float32.)"""
    monkeypatch.setenv("TRTSPEC_DRAFT_DTYPE", "float32")
    eng = engine(fam, "draft-model", draft="draft_near")
    sps = [SamplingParams(max_new_tokens=30, temperature=0.8, top_p=0.9, seed=i, num_draft_tokens=3)
           for i in range(len(prompts))]
    single = [eng.generate(p, sp).tokens for p, sp in zip(prompts, sps)]
    assert [r.tokens for r in eng.generate_batch(prompts, sps)] == single
    again = eng.generate(prompts[0], sps[0]).tokens
    assert again == single[0]
    other = eng.generate(prompts[0], SamplingParams(**{**sps[0].__dict__, "seed": 99})).tokens
    assert other != single[0]


def test_mixed_greedy_and_sampled_rows_in_one_batch(fam, prompts, reference):
    """Greedy rows keep their exact output next to sampled rows (different settings, same verify pass)."""
    for method, kw in (("draft-model", dict(draft="draft_near")), ("medusa", dict(k=6, choices=[[0], [1], [0, 0]])),
                       ("lookahead", {})):
        eng = engine(fam, method, **kw)
        sps = [SamplingParams(max_new_tokens=N_NEW, num_draft_tokens=eng.k_max) if i % 2 == 0 else
               SamplingParams(max_new_tokens=N_NEW, temperature=0.7, top_k=20, seed=i, num_draft_tokens=eng.k_max)
               for i in range(len(prompts))]
        res = eng.generate_batch(prompts, sps)
        assert [r.tokens for r in res[::2]] == reference[::2], method
        assert all(len(r.tokens) > 0 for r in res[1::2])


# --------------------------------------------------------------------------- continuous batching, submit()

def test_submit_concurrent_requests_equal_single_ones(fam, prompts, reference):
    eng = engine(fam, "draft-model", draft="draft_near", batch=3)
    events: dict[str, list] = {}
    done = threading.Event()
    lock = threading.Lock()
    ids: dict[int, str] = {}

    def on_event(ev):
        with lock:
            events.setdefault(ev.request_id, []).append(ev)
            if sum(1 for evs in events.values() if evs[-1].finished) == len(prompts):
                done.set()

    def client(idx):
        for i in idx:
            ids[i] = eng.submit(prompts[i], SamplingParams(max_new_tokens=N_NEW), on_event)

    threads = [threading.Thread(target=client, args=(range(j, len(prompts), 3),)) for j in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert done.wait(120)
    for i, ref in enumerate(reference):
        evs = events[ids[i]]
        assert [t for ev in evs for t in ev.tokens] == ref
        assert evs[-1].finished and evs[-1].finish_reason in ("length", "eos")
        assert all(not ev.finished for ev in evs[:-1])
    # the synchronous API still works while the scheduler thread runs
    assert eng.generate(prompts[0], SamplingParams(max_new_tokens=N_NEW)).tokens == reference[0]
    eng.close()
    with pytest.raises(GenerationError):
        eng.submit(prompts[0], SamplingParams(), lambda ev: None)


def test_cancel_frees_the_row(fam, prompts, reference):
    eng = engine(fam, "none", batch=1)
    first = threading.Event()
    got = []

    def on_event(ev):
        got.append(ev)
        first.set()

    rid = eng.submit(prompts[0], SamplingParams(max_new_tokens=64, end_id=-1), on_event)
    assert first.wait(30)
    eng.cancel(rid)
    res = eng.generate(prompts[1], SamplingParams(max_new_tokens=N_NEW))  # waits for the only row
    assert res.tokens == reference[1]
    assert got[-1].finished and got[-1].finish_reason == "cancelled"
    eng.close()


# ---------------------------------------------------------------------------------------- stops, stream

def test_stop_string_eos_and_stream(fam, prompts, plain):
    eng = engine(fam, "lookahead")
    tok = eng.tokenizer
    full = eng.generate(prompts[2], SamplingParams(max_new_tokens=30, end_id=-1))
    assert full.finish_reason == "length" and len(full.tokens) == 30
    # stop string: the text of tokens 5..6 of the output, trimmed from the text, generation ends there
    stop = tok.decode(full.tokens[5:7])
    res = eng.generate(prompts[2], SamplingParams(max_new_tokens=30, end_id=-1, stop=(stop,)))
    assert res.finish_reason == "stop"
    assert stop not in res.text and full.text.startswith(res.text)
    assert res.tokens == full.tokens[:len(res.tokens)] and len(res.tokens) <= 7
    # end_id: a token that occurs in the output ends generation and is included
    end = full.tokens[9]
    res = eng.generate(prompts[2], SamplingParams(max_new_tokens=30, end_id=end))
    assert res.finish_reason == "eos" and res.tokens == full.tokens[:full.tokens.index(end) + 1]
    # stream: events add up to the result, the last one finishes it
    evs = list(eng.stream(prompts[2], SamplingParams(max_new_tokens=30, end_id=-1)))
    assert [t for ev in evs for t in ev.tokens] == full.tokens
    assert "".join(ev.text for ev in evs) == full.text
    assert evs[-1].finished and evs[-1].finish_reason == "length"
    assert evs[0].tokens == full.tokens[:1]  # the prefill's token comes first (time to first token)
    # a string prompt goes through the tokenizer
    text = tok.decode(prompts[2])
    assert eng.generate(text, SamplingParams(max_new_tokens=30, end_id=-1)).tokens == full.tokens


def test_streamed_text_never_shows_a_stop_string(fam, prompts):
    """A stop string spanning several steps: the text streamed before it completes holds back its beginning,
    so the events add up to the trimmed result text (not to the text with the stop string's first part)."""
    from trtspec.runtime.detok import stop_prefix

    assert [stop_prefix(t, ("w3 w4 w5",)) for t in ("w1 w3", "w1 w3 w4", "w1 w3 w4 w", "w1 w6")] == [2, 5, 7, 0]
    eng = engine(fam, "none")
    full = eng.generate(prompts[3], SamplingParams(max_new_tokens=12, end_id=-1))
    stop = eng.tokenizer.decode(full.tokens[4:7])
    evs = list(eng.stream(prompts[3], SamplingParams(max_new_tokens=12, end_id=-1, stop=(stop, "zz"))))
    assert evs[-1].finish_reason == "stop"
    streamed = "".join(ev.text for ev in evs)
    assert streamed == full.text[:full.text.find(stop)] == eng.generate(
        prompts[3], SamplingParams(max_new_tokens=12, end_id=-1, stop=(stop,))).text


def test_result_stats(fam, prompts):
    eng = engine(fam, "draft-model", draft="draft_near")
    r = eng.generate(prompts[1], SamplingParams(max_new_tokens=N_NEW, end_id=-1, num_draft_tokens=3))
    assert r.prompt_tokens == len(prompts[1]) and len(r.tokens) == N_NEW
    assert r.steps > 0 and r.drafted >= r.accepted > 0
    assert r.acceptance_rate == pytest.approx(r.accepted / r.drafted)
    assert r.tokens_per_step == pytest.approx((N_NEW - 1) / r.steps)
    assert 0 < r.ttft_seconds <= r.seconds and r.draft_seconds > 0 and r.verify_seconds > 0
    assert set(r.to_dict()) >= {"tokens", "text", "finish_reason", "acceptance_rate", "tokens_per_step"}


# ------------------------------------------------------------------------------------------- validation

@pytest.mark.parametrize("prompt,params,match", [
    ([], SamplingParams(max_new_tokens=8), "empty prompt"),
    ([1] * 65, SamplingParams(max_new_tokens=8), "max_input_len"),
    ([1, 2], SamplingParams(max_new_tokens=0), "max_new_tokens"),
    ([1, 2], SamplingParams(max_new_tokens=65), "max_new_tokens"),
    ([1, VOCAB], SamplingParams(max_new_tokens=8), "token ids"),
    ([1, 2], SamplingParams(max_new_tokens=8, temperature=-1.0), "sampling"),
    ([1, 2], SamplingParams(max_new_tokens=8, top_p=0.0), "sampling"),
    ([1, 2], SamplingParams(max_new_tokens=8, num_draft_tokens=9), "num_draft_tokens"),
    ([1, 2], SamplingParams(max_new_tokens=8, stop="x"), "stop"),
])
def test_bad_requests_raise_generation_error(fam, prompt, params, match):
    eng = engine(fam, "draft-model")
    with pytest.raises(GenerationError, match=match):
        eng.generate(prompt, params)
    with pytest.raises(GenerationError, match=match):
        eng.submit(prompt, params, lambda ev: None)
    with pytest.raises(GenerationError, match=match):
        list(eng.stream(prompt, params))
    assert eng.num_active == 0 and eng.num_waiting == 0
    eng.close()


def test_empty_string_prompt_is_rejected(fam):
    with pytest.raises(GenerationError, match="empty prompt"):
        engine(fam, "none").generate("", SamplingParams())


# ---------------------------------------------------------------------------------------------- adaptive

def test_adaptive_k_follows_the_formula_falls_back_and_probes():
    chain = [(k, k) for k in range(1, 9)]
    # K maximising E[tau](alpha, K) / (1 + K c) (a draft step costs c, verify rows nothing): grows with alpha
    assert [best_option(a, chain, nominal(0.15)) for a in (0.95, 0.83, 0.7, 0.5, 0.3)] == [8, 5, 3, 2, 1]
    assert best_option(0.83, chain, nominal(0.0)) == 8 and best_option(0.83, chain, nominal(1.0)) == 1
    a = AdaptiveK([(k, k) for k in range(1, 7)], AdaptiveConfig(min_draft_tokens=2, history=4, fallback_acceptance=0.3),
                  nominal(0.15))
    assert a.next_k() == 6  # no estimate yet: optimistic
    for _ in range(6):
        a.update(6, 6, 6)
    assert a.alpha == 1.0 and a.k == 6
    for _ in range(6):
        a.update(a.k, 1, a.k)  # one accepted, then a rejection: per-token acceptance 1/2
    assert 2 <= a.k <= 3
    for _ in range(8):
        a.update(a.k, 0, a.k)
    assert a.alpha < 0.3
    assert [a.next_k() for _ in range(4)] == [0, 0, 0, 0]  # plain decoding for `history` steps
    assert a.next_k() == 2  # a probe with the smallest option (min_draft_tokens)
    a.update(2, 0, 2)  # a bad probe: plain again, twice as long
    assert [a.next_k() for _ in range(9)] == [0] * 8 + [2]
    a.update(2, 0, 2)  # another: four times
    assert [a.next_k() for _ in range(17)] == [0] * 16 + [2]
    a.update(2, 2, 2)  # a good probe restarts the estimate
    assert a.next_k() == 6


def test_tree_options_for_adaptive_k():
    from trtspec.runtime.proposer import tree_from_choices, tree_options

    tree = tree_from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]])
    assert tree_options(tree, 8) == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 2), (6, 3), (7, 3), (8, 4)]


def test_load_cap_and_adaptive_fallback_in_the_engine(fam, prompts):
    assert [load_cap(8, n) for n in (1, 2, 3, 4, 8, 64)] == [8, 8, 4, 4, 2, 1]
    bad = engine(fam, "draft-model")  # independent random draft: almost never accepted
    res = bad.generate(prompts[0], SamplingParams(max_new_tokens=60, end_id=-1))
    fixed = bad.generate(prompts[0], SamplingParams(max_new_tokens=60, end_id=-1, num_draft_tokens=4))
    assert res.tokens == fixed.tokens
    assert res.drafted < fixed.drafted / 3  # fell back to plain decoding most of the time
    good = engine(fam, "draft-model", draft="draft_near")
    r = good.generate(prompts[0], SamplingParams(max_new_tokens=60, end_id=-1))
    assert r.drafted / r.steps > 2.0  # kept speculating


def test_a_batched_drafter_catches_up_a_long_backlog_in_a_pass_of_its_own(fam, monkeypatch):
    """A new prompt's tokens reach the draft model in a pass of that row alone: in the batch's pass every row is
    padded to the longest feed (B rows x a prompt's length). The outputs stay those of decoding one by one."""
    from trtspec.methods.draft_model import CATCH_UP

    eng = engine(fam, "draft-model", draft="draft_near")
    sp = SamplingParams(max_new_tokens=12, num_draft_tokens=4)
    prompts = [list(range(1, 31)), [5, 6, 7]]
    single = [eng.generate(p, sp).tokens for p in prompts]
    shapes: list[tuple[int, int]] = []
    model, forward = eng.proposer.model, eng.proposer.model.forward

    def spy(cache, positions, *args, **kwargs):
        shapes.append(tuple(positions.shape))
        return forward(cache, positions, *args, **kwargs)

    monkeypatch.setattr(model, "forward", spy)
    assert [r.tokens for r in eng.generate_batch(prompts, sp)] == single
    assert any(b == 1 and t >= CATCH_UP for b, t in shapes)  # the 30-token prompt, alone
    assert all(t <= CATCH_UP for b, t in shapes if b > 1)  # no batched pass at a prompt's length
