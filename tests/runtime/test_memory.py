"""Loading without copies: the same numbers as the eager, all-float32 load."""

from __future__ import annotations

import pytest
import torch

from tests.runtime import family
from trtspec.artifacts.hf import ModelConfig
from trtspec.artifacts.weights import load_file, load_weights, open_weights
from trtspec.errors import ModelError
from trtspec.runtime import llama as L
from trtspec.runtime.quant import quantize_llama


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    """A tiny tied Qwen2-shaped model (q/k/v biases) stored in bfloat16, as the real pair is."""
    path = tmp_path_factory.mktemp("bf16") / "m"
    model = family.save_llama(path, seed=11, tie_word_embeddings=True)
    model.to(torch.bfloat16).save_pretrained(path)
    return path


def test_lazy_weights_read_what_safetensors_reads(bf16_dir, tmp_path):
    eager = load_file(bf16_dir / "model.safetensors")
    lazy = open_weights(bf16_dir)
    assert set(lazy) == set(eager) and len(lazy) == len(eager)
    for k, v in eager.items():
        t = lazy[k]
        assert t.dtype == v.dtype and torch.equal(t, v)
        assert t.data_ptr() != lazy[k].data_ptr()  # a fresh tensor each time: nothing is cached
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "model.safetensors").write_bytes((bf16_dir / "model.safetensors").read_bytes()[:-64])
    w = open_weights(cut)
    last = max(w.where, key=lambda k: w.where[k][2]["data_offsets"][1])
    with pytest.raises(ModelError, match="past the end of the file"):
        w[last]


def _logits(m: L.Llama, ids: list[int]) -> torch.Tensor:
    from trtspec.runtime.cache import chain_inputs

    cache = m.new_cache(1, 64)
    inp = chain_inputs([0], len(ids))
    lg, _ = m.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([ids]))
    return lg


@pytest.mark.parametrize("wdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("quantization", [None, "int8"])
@pytest.mark.parametrize("big", [False, True])
def test_from_dir_computes_what_the_eager_float32_load_did(bf16_dir, wdt, quantization, big, monkeypatch):
    """The old load: every tensor read at once, cast to float32, then to the matmul dtype, prepacked, the plain
    weights kept, quantized afterwards. from_dir now reads tensor by tensor into their final dtype, keeps the
    embedding in bf16, quantizes as it loads and releases prepacked weights: the logits are the same bits."""
    if big:  # the large-model path: oneDNN for one row, fp32 weights released too
        monkeypatch.setattr(L, "ONEDNN_SINGLE_ROW_BYTES", 0)
    cfg = ModelConfig.from_dir(bf16_dir)
    old = L.Llama(cfg, {k: v.float() for k, v in load_weights(bf16_dir).items()}, weight_dtype=wdt, max_seq=64)
    if quantization:
        quantize_llama(old, quantization)
    new = L.Llama.from_dir(bf16_dir, weight_dtype=wdt, max_seq=64, quantization=quantization)
    assert new.embed.dtype == torch.bfloat16 and old.embed.dtype == torch.float32
    ids = [1, 5, 9, 33, 2, 70, 11]
    assert torch.equal(_logits(new, ids), _logits(old, ids))
    lins = [new.head] + [x for lw in new.layers for x in (lw.qkv, lw.o, lw.gate_up, lw.down)]
    if quantization is None and (big or wdt == torch.bfloat16) and all(x.packed is not None for x in lins):
        assert all(x.released for x in lins)  # no plain copy beside the packed one
        assert new.num_params == old.num_params
        with pytest.raises(ValueError, match="released"):
            quantize_llama(new, "int4")
