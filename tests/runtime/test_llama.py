"""The compact Llama against transformers' LlamaForCausalLM, and the cache/mask machinery against full passes."""

from __future__ import annotations

import json

import pytest
import torch

from tests.runtime import family
from tests.support import MODELS as DEMO_MODELS, demo_ready
from trtspec.errors import ModelError
from trtspec.runtime.cache import chain_inputs, tree_inputs
from trtspec.runtime.llama import Llama

ROPES = {
    "default": None,
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
}


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


def _full(ours: Llama, ids: list[list[int]]):
    cache = ours.new_cache(len(ids))
    inp = chain_inputs([0] * len(ids), len(ids[0]))
    return ours.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor(ids))


@pytest.mark.parametrize("rope", list(ROPES))
def test_logits_match_transformers_gqa_tied(tmp_path, rope):
    """GQA (4 heads / 2 kv), explicit head_dim != hidden/heads, tied embeddings, each rope type."""
    hf = family.save_llama(tmp_path, seed=3, tie_word_embeddings=True, head_dim=24, rope_scaling=ROPES[rope],
                           rope_theta=500.0, max_position_embeddings=64)
    ours = Llama.from_dir(tmp_path, max_seq=64)
    assert ours.lm_head is ours.embed
    ids = torch.randint(0, family.VOCAB, (2, 40), generator=torch.Generator().manual_seed(0)).tolist()
    ref = _hf_logits(hf, ids)
    got, hidden = _full(ours, ids)
    assert ref.abs().max() > 1.0  # not vacuous: logits are far from zero
    assert (got - ref).abs().max().item() <= 1e-4
    assert hidden.shape == (2, 40, 64)


def test_an_untied_head_is_held_once(tmp_path):
    """from_dir keeps an untied head's source tensor only as meta (its head holds its own copy); head_weight()
    reads it again as stored, and the model counts and computes as before."""
    from safetensors.torch import load_file

    hf = family.save_llama(tmp_path, seed=5)
    ours = Llama.from_dir(tmp_path)
    assert ours.lm_head.is_meta and ours.lm_head.shape == (family.VOCAB, 64)
    stored = load_file(tmp_path / "model.safetensors")["lm_head.weight"]
    assert torch.equal(ours.head_weight(), stored) and ours.head_weight().dtype == stored.dtype
    assert ours.num_params == sum(p.numel() for p in hf.parameters())
    ids = [[1, 5, 9, 33, 2, 70]]
    kept = Llama(ours.cfg, dict(load_file(tmp_path / "model.safetensors")))  # built from a dict: nothing dropped
    assert not kept.lm_head.is_meta
    assert torch.equal(_full(ours, ids)[0], _full(kept, ids)[0])


def test_logits_match_transformers_untied_bias_and_fp16_storage(tmp_path):
    hf = family.save_llama(tmp_path, seed=4, attention_bias=True, mlp_bias=True)
    ref = _hf_logits(hf, [[1, 5, 9, 33, 2, 70]])
    ours = Llama.from_dir(tmp_path)
    assert (_full(ours, [[1, 5, 9, 33, 2, 70]])[0] - ref).abs().max().item() <= 1e-4
    # float16 serving dtype on CPU: computes in float32 on the fp16-rounded weights
    half = Llama.from_dir(tmp_path, dtype="float16")
    assert half.dtype == torch.float32


def test_incremental_batched_and_tree_passes_equal_the_full_pass(fam):
    """KV cache per row at different lengths, padded batches and a tree mask all reproduce one full pass."""
    ours = Llama.from_dir(fam / "target", max_seq=128)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, family.VOCAB, (n,), generator=g).tolist() for n in (23, 9)]
    ref = [_full(ours, [s])[0][0] for s in seqs]
    # two rows prefilled together (padded), then decoded token by token, each at its own length
    cache = ours.new_cache(2)
    start = [6, 3]
    T = max(start)
    inp = chain_inputs([0, 0], T)
    toks = torch.tensor([s[:n] + [0] * (T - n) for s, n in zip(seqs, start)])
    lg, _ = ours.forward(cache, inp.positions, inp.start, inp.mask, tokens=toks)
    for b in range(2):
        assert torch.allclose(lg[b, :start[b]], ref[b][:start[b]], atol=1e-4)
    cache.lengths = list(start)
    for step in range(6):
        inp = chain_inputs(cache.lengths, 1)
        toks = torch.tensor([[s[n]] for s, n in zip(seqs, cache.lengths)])
        lg, _ = ours.forward(cache, inp.positions, inp.start, inp.mask, tokens=toks)
        for b in range(2):
            assert torch.allclose(lg[b, 0], ref[b][cache.lengths[b]], atol=1e-4)
        cache.lengths = [n + 1 for n in cache.lengths]
    # row 0: a tree whose branch [true, true] is the real continuation, with decoys around it
    n0 = cache.lengths[0]
    s = seqs[0]
    decoy = (s[n0 + 1] + 1) % family.VOCAB
    tokens = [s[n0], decoy, s[n0 + 1], s[n0 + 2], decoy]
    parents = (-1, 0, 0, 2, 1)  # inputs: 0 root, 1 decoy, 2 true, 3 true-under-2, 4 under decoy
    inp = tree_inputs([n0], [parents])
    lg, _ = ours.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([tokens]))
    for i, pos in ((0, n0), (2, n0 + 1), (3, n0 + 2)):
        assert torch.allclose(lg[0, i], ref[0][pos], atol=1e-4)
    # keep the path root -> 2 -> 3 (not contiguous): compact and continue decoding
    cache.keep_path(0, n0, [0, 2, 3])
    assert cache.lengths[0] == n0 + 3
    inp = chain_inputs([n0 + 3], 2)
    lg, _ = ours.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([s[n0 + 3:n0 + 5]]))
    assert torch.allclose(lg[0], ref[0][n0 + 3:n0 + 5], atol=1e-4)


def test_unreadable_and_unsupported_checkpoints_raise_model_error(tmp_path, fam):
    with pytest.raises(ModelError, match="not found"):
        Llama.from_dir(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    cfg = json.loads((fam / "target" / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(ModelError, match="gpt2"):
        Llama.from_dir(bad)
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match="model.safetensors"):
        Llama.from_dir(bad)
    (bad / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelError, match="model.safetensors: not a readable safetensors file"):  # (as `check` says)
        Llama.from_dir(bad)


@pytest.mark.skipif(not demo_ready("target"), reason="demo target not trained yet (examples/models/target)")
def test_demo_target_matches_transformers():
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(DEMO_MODELS / "target", dtype=torch.float32).eval()
    ours = Llama.from_dir(DEMO_MODELS / "target", max_seq=256)
    ids = torch.randint(0, ours.cfg.vocab_size, (1, 96), generator=torch.Generator().manual_seed(0)).tolist()
    assert (_full(ours, ids)[0] - _hf_logits(hf, ids)).abs().max().item() <= 1e-4
