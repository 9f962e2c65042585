"""Each proposer proposes what its formula says: every proposal made inside a running engine (batched, with
acceptances and rollbacks in between) is recomputed here from scratch, without caches, from the documented
equations (trtspec/artifacts/heads.py docstring) on transformers' hidden states."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from tests.runtime import family
from tests.runtime.family import engine
from trtspec.methods.ngram import NgramProposer
from trtspec.runtime import SamplingParams
from trtspec.runtime.proposer import tree_from_choices, trie

TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


@pytest.fixture(autouse=True)
def full_precision_proposers(monkeypatch):
    """Compare against the float32 formulas exactly (proposers may run in bf16 on CPU otherwise)."""
    monkeypatch.setenv("TRTSPEC_DRAFT_DTYPE", "float32")


def record(eng):
    """Log (sequence, draft) of every proposal the engine's proposer makes."""
    log, orig = [], eng.proposer.propose

    def propose(batch):
        drafts = orig(batch)
        log.extend((list(seq), d) for seq, d in zip(batch.seqs, drafts) if d.tokens)
        return drafts

    eng.proposer.propose = propose
    return log


def hf_features(hf, seq: list[int]) -> torch.Tensor:
    """f_t: transformers' final post-norm hidden states over seq (checked: lm_head(f) == logits)."""
    with torch.no_grad():
        out = hf(torch.tensor([seq]), output_hidden_states=True)
    f = out.hidden_states[-1][0]
    assert torch.allclose(hf.lm_head(f), out.logits[0], atol=1e-4)
    return f


def run_engine(eng, prompts):
    return eng.generate_batch(prompts, SamplingParams(max_new_tokens=24, end_id=-1, num_draft_tokens=eng.k_max))


def nodes_of(choices, k):
    return [tuple(c) for c in choices[:k]] if choices else [(0,) * (d + 1) for d in range(k)]


# ---------------------------------------------------------------------------------------------- medusa

@pytest.mark.parametrize("choices,k", [(None, 3), (TREE, 6)])
def test_medusa_proposals_follow_the_heads_formula(fam, hf_target, choices, k):
    w = load_file(str(fam / "medusa" / "medusa_lm_head.safetensors"))
    eng = engine(fam, "medusa", k=k, choices=choices)
    log = record(eng)
    run_engine(eng, [[5, 6, 7], [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [40]])
    assert len(log) > 20
    for seq, draft in log:
        f = hf_features(hf_target, seq[:-1])[-1]  # the last position the target has run

        def head(h):
            x = f + F.silu(w[f"{h}.0.linear.weight"] @ f + w[f"{h}.0.linear.bias"])
            return w[f"{h}.1.weight"] @ x

        want = [head(len(c) - 1).topk(c[-1] + 1).indices[-1].item() for c in nodes_of(choices, len(draft.tokens))]
        assert draft.tokens == want
        parents = [-1 if len(c) == 1 else nodes_of(choices, k).index(c[:-1]) for c in nodes_of(choices, k)]
        assert list(draft.parents) == parents[:len(draft.tokens)]


# ----------------------------------------------------------------------------------------------- eagle

def naive_eagle(w, cfg, E, tokens: list[int], feats: torch.Tensor) -> torch.Tensor:
    """The EAGLE head over positions 0..T-1 from scratch: f^_{t+1} for each t (input: E[x_{t+1}], f_t)."""
    H, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or H // nh
    T = len(tokens)
    x = torch.cat([E[tokens], feats], -1) @ w["fc.weight"].T + w["fc.bias"]
    inv = 1.0 / (cfg["rope_parameters"]["rope_theta"] ** (torch.arange(0, D, 2).float() / D))
    ang = torch.arange(T).float()[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(t):  # [heads, T, D]
        t1, t2 = t[..., : D // 2], t[..., D // 2:]
        return t * cos + torch.cat([-t2, t1], -1) * sin

    a = "layers.0.self_attn."
    q = rope((x @ w[a + "q_proj.weight"].T).view(T, nh, D).transpose(0, 1))
    k = rope((x @ w[a + "k_proj.weight"].T).view(T, nkv, D).transpose(0, 1)).repeat_interleave(nh // nkv, 0)
    v = (x @ w[a + "v_proj.weight"].T).view(T, nkv, D).transpose(0, 1).repeat_interleave(nh // nkv, 0)
    scores = (q @ k.transpose(1, 2)) / math.sqrt(D) + torch.full((T, T), float("-inf")).triu(1)
    o = (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, nh * D)
    x = x + o @ w[a + "o_proj.weight"].T
    r = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"])
         * w["layers.0.post_attention_layernorm.weight"])
    m = "layers.0.mlp."
    return x + (F.silu(r @ w[m + "gate_proj.weight"].T) * (r @ w[m + "up_proj.weight"].T)) @ w[m + "down_proj.weight"].T


@pytest.mark.parametrize("oracle", [False, True])
@pytest.mark.parametrize("choices,k", [(None, 4), (TREE, 6)])
def test_eagle_proposals_follow_the_head_formula(fam, hf_target, tmp_path, oracle, choices, k):
    """Random head (rejects nearly all) and the oracle head (accepts many: multi-position cache syncs)."""
    import json

    from transformers import LlamaForCausalLM

    if oracle:
        tdir, edir = family.save_eagle_oracle(tmp_path)
        hf = LlamaForCausalLM.from_pretrained(tdir).eval()
        eng = engine(tmp_path, "eagle", target="target1", heads="eagle_oracle", k=k, choices=choices)
    else:
        tdir, edir, hf = fam / "target", fam / "eagle", hf_target
        eng = engine(fam, "eagle", k=k, choices=choices)
    w = load_file(str(edir / "model.safetensors"))
    cfg = json.loads((edir / "config.json").read_text())
    E, L = hf.model.embed_tokens.weight.detach(), hf.lm_head.weight.detach()
    log = record(eng)
    res = run_engine(eng, [[5, 6, 7], [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [40]])
    assert len(log) > 15
    if oracle:
        assert sum(r.accepted for r in res) > 20
    all_nodes = nodes_of(choices, k)
    for seq, draft in log:
        f = hf_features(hf, seq[:-1])
        with torch.no_grad():
            states = {(): (seq[1:], f)}  # path -> (tokens x_{t+1}, features) of the head's inputs
            outs = {}
            for c in all_nodes[:len(draft.tokens)]:
                toks, feats = states[c[:-1]]
                if c[:-1] not in outs:
                    outs[c[:-1]] = naive_eagle(w, cfg, E, toks, feats)[-1]
                tok = (L @ outs[c[:-1]]).topk(c[-1] + 1).indices[-1].item()
                states[c] = (toks + [tok], torch.cat([feats, outs[c[:-1]][None]]))
                assert draft.tokens[all_nodes.index(c)] == tok, (seq, c)


# ---------------------------------------------------------------------------------------------- n-gram

def test_ngram_candidates_and_trie():
    d = NgramProposer(ngram=3, verification_set=2)
    d.setup(None, 1, 64, 4)
    d.admit(0, None)
    seq = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # last 3 tokens [5, 2, 3] never occurred; [2, 3] did, at 1..2 (-> 9 9 1) and 6..7 (-> 7 8 5): newest first
    assert d.candidates(0, seq, 3) == [[7, 8, 5], [9, 9, 1]]
    seq = seq + [7]  # [2, 3, 7] occurred once (6..8)
    assert d.candidates(0, seq, 4) == [[8, 5, 2, 3]]
    d.admit(0, None)  # a new request in row 0: a fresh index (else [4, 4] is looked up in the one above)
    assert d.candidates(0, [4, 4], 2) == [[4]]
    t = trie([[1, 2, 3], [1, 2, 4], [5]])
    assert t.tokens == [1, 2, 3, 4, 5] and t.parents == (-1, 0, 1, 1, -1)


def test_ngram_min_matching_leaves_out_shorter_matches():
    """min_matching = 2 (vLLM's prompt_lookup_min): a sequence whose end matches only one earlier token proposes
    nothing; a two-token match still proposes."""
    seq = [1, 2, 3, 9, 4, 5, 3]  # [9, 4, 5, 3]: only [3] occurred before (-> 9 4 5)
    one, two = NgramProposer(ngram=3, verification_set=2), NgramProposer(ngram=3, verification_set=2, min_ngram=2)
    for d in (one, two):
        d.setup(None, 1, 64, 4)
        d.admit(0, None)
    assert one.candidates(0, seq, 3) == [[9, 4, 5]] and two.candidates(0, seq, 3) == []
    assert two.candidates(0, seq + [9], 2) == [[4, 5]]  # [3, 9] occurred: a two-token match


def test_tree_from_choices():
    assert tree_from_choices(TREE) == [(-1, 0, 1), (-1, 1, 1), (0, 0, 2), (0, 1, 2), (1, 0, 2), (2, 0, 3)]
