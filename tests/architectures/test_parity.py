"""Every architecture's logits equal transformers' (fp32, within 1e-4) on checkpoints transformers wrote:
a full pass, and the cache path (token-by-token decode and a draft tree) against the full pass, which is what
speculation relies on; sliding windows shorter than the sequence; and the one error for what is not run."""

from __future__ import annotations

import json

import pytest
import torch

from tests.architectures import models
from tests.runtime import family
from trtspec.errors import ModelError
from trtspec.runtime.cache import chain_inputs, tree_inputs
from trtspec.runtime.llama import Llama

SEQ = 40


def _full(ours: Llama, ids: torch.Tensor) -> torch.Tensor:
    inp = chain_inputs([0] * ids.shape[0], ids.shape[1])
    return ours.forward(ours.new_cache(ids.shape[0]), inp.positions, inp.start, inp.mask, tokens=ids)[0]


@pytest.mark.parametrize("case", list(models.CASES))
def test_logits_equal_transformers(tmp_path, case):
    model_type, kw = models.CASES[case]
    hf = models.save(tmp_path, model_type, seed=3, tokenizer=False, **kw)
    ours = Llama.from_dir(tmp_path, max_seq=SEQ)
    ids = torch.randint(0, family.VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
    got = _full(ours, ids)
    assert ref.abs().max() > 1.0  # not vacuous
    assert (got - ref).abs().max().item() <= 1e-4
    if kw.get("tie_word_embeddings"):
        assert ours.lm_head is ours.embed  # stored once


@pytest.mark.parametrize("case", ["mistral-window", "qwen2-window", "qwen3-bias-window"])
def test_the_window_matters_and_the_cache_path_keeps_it(tmp_path, case):
    """Decoding token by token past the window and verifying a tree there give the full pass's logits; the
    same checkpoint without its window gives other logits (so the window is really applied)."""
    model_type, kw = models.CASES[case]
    models.save(tmp_path, model_type, seed=5, tokenizer=False, **kw)
    ours = Llama.from_dir(tmp_path, max_seq=64)
    s = torch.randint(0, family.VOCAB, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    ref = _full(ours, torch.tensor([s]))[0]
    cache = ours.new_cache(1)
    inp = chain_inputs([0], 5)
    ours.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([s[:5]]))
    cache.lengths = [5]
    for n in range(5, 24):
        inp = chain_inputs([n], 1)
        lg, _ = ours.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([[s[n]]]))
        assert torch.allclose(lg[0, 0], ref[n], atol=1e-4), n
        cache.lengths = [n + 1]
    n0 = cache.lengths[0]
    decoy = (s[n0 + 1] + 1) % family.VOCAB
    inp = tree_inputs([n0], [(-1, 0, 0, 2, 1)])  # root, decoy, true, true-under-true, under-decoy
    lg, _ = ours.forward(cache, inp.positions, inp.start, inp.mask,
                         tokens=torch.tensor([[s[n0], decoy, s[n0 + 1], s[n0 + 2], decoy]]))
    for i, pos in ((0, n0), (2, n0 + 1), (3, n0 + 2)):
        assert torch.allclose(lg[0, i], ref[pos], atol=1e-4)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "sliding_window": None, "use_sliding_window": False}))
    unwindowed = _full(Llama.from_dir(tmp_path, max_seq=64), torch.tensor([s]))[0]
    assert (unwindowed[20:] - ref[20:]).abs().max() > 1e-2


def test_an_unsupported_architecture_is_named_with_the_supported_ones(tmp_path):
    models.save(tmp_path, "llama", seed=1, tokenizer=False)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "gemma",
                                                      "architectures": ["GemmaForCausalLM"]}))
    with pytest.raises(ModelError, match="'GemmaForCausalLM'.*not supported") as info:
        Llama.from_dir(tmp_path)
    for name in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert name in info.value.hint


def test_a_bias_the_architecture_has_must_be_in_the_checkpoint(tmp_path):
    from safetensors.torch import load_file, save_file

    models.save(tmp_path, "qwen2", seed=1, tokenizer=False)
    w = load_file(str(tmp_path / "model.safetensors"))
    del w["model.layers.1.self_attn.k_proj.bias"]
    save_file(w, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelError, match="layers.1.self_attn.k_proj.bias"):
        Llama.from_dir(tmp_path)


def test_the_target_weight_dtype_follows_the_cpu(monkeypatch):
    """bf16 matmul weights only where the CPU multiplies bf16 natively and the spec serves 16 bits; float32
    (None: the compute dtype) on CPUs like this project's, on CUDA, and for float32 specs."""
    from trtspec.runtime import dtypes

    monkeypatch.delenv("TRTSPEC_TARGET_DTYPE", raising=False)
    monkeypatch.setattr(dtypes, "cpu_has_fast_bf16", lambda: True)
    assert dtypes.target_weight_dtype("float16", "cpu") == torch.bfloat16
    assert dtypes.target_weight_dtype("bfloat16", "cpu") == torch.bfloat16
    assert dtypes.target_weight_dtype("float32", "cpu") is None
    assert dtypes.target_weight_dtype("float16", "cuda") is None
    monkeypatch.setattr(dtypes, "cpu_has_fast_bf16", lambda: False)
    assert dtypes.target_weight_dtype("float16", "cpu") is None
    monkeypatch.setenv("TRTSPEC_TARGET_DTYPE", "float32")
    monkeypatch.setattr(dtypes, "cpu_has_fast_bf16", lambda: True)
    assert dtypes.target_weight_dtype("float16", "cpu") == torch.float32


@pytest.mark.parametrize("capability", ["AVX2", "DEFAULT"])
def test_kernels_capped_below_avx512_have_no_native_bf16(monkeypatch, capability):
    """ATEN_CPU_CAPABILITY=avx2 (how an AVX-512 machine stands in for an AVX2-only one) caps torch's kernels:
    bf16 is then not native, whatever /proc/cpuinfo says, so weights stay float32 as on such a machine."""
    from trtspec.runtime import dtypes

    dtypes.cpu_has_fast_bf16.cache_clear()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    try:
        assert dtypes.cpu_has_fast_bf16() is False
        assert dtypes.target_weight_dtype("bfloat16", "cpu") is None
    finally:
        dtypes.cpu_has_fast_bf16.cache_clear()
