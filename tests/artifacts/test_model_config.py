"""ModelConfig: HF config.json read through transformers (every spelling alike), one ModelError per unreadable
config naming the file and the key, and RoPE frequencies from transformers' own functions."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from tests.runtime import family
from trtspec.artifacts.hf import ModelConfig, rope_inv_freq
from trtspec.errors import ConvertError, ModelError

BASE = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 16}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}


def _write(tmp_path, cfg: dict):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


@pytest.mark.parametrize("kind,params", [("linear", {"factor": 2.0}), ("dynamic", {"factor": 2.0}),
                                         ("llama3", LLAMA3)])
def test_rope_scaling_and_rope_parameters_spellings_read_alike(tmp_path, kind, params):
    """transformers 4.x `rope_scaling` with `type` (theta beside it) and 5.x `rope_parameters` with `rope_type`."""
    old = ModelConfig.from_dict({**BASE, "rope_theta": 500.0, "rope_scaling": {"type": kind, **params}})
    new = ModelConfig.from_dict({**BASE, "rope_parameters": {"rope_type": kind, "rope_theta": 500.0, **params}})
    on_disk = ModelConfig.from_dir(_write(tmp_path, {**BASE, "rope_theta": 500.0,
                                                     "rope_scaling": {"rope_type": kind, **params}}))
    assert old == new == on_disk
    assert new.rope_theta == 500.0 and new.rope_scaling == {"rope_type": kind, **params}
    assert ModelConfig.from_dict(BASE).rope_scaling is None and ModelConfig.from_dict(BASE).rope_type == "default"


def test_special_tokens_are_what_the_file_says_not_class_defaults():
    """LlamaConfig() has bos 1 / eos 2; a config naming none has none (the runtime stops on eos)."""
    bare = ModelConfig.from_dict(BASE)
    assert bare.eos_token_ids == () and bare.bos_token_id is None
    named = ModelConfig.from_dict({**BASE, "eos_token_id": [5, 7], "bos_token_id": 3})
    assert named.eos_token_ids == (5, 7) and named.bos_token_id == 3
    assert ModelConfig.from_dict({**BASE, "architectures": "LlamaForCausalLM"}).architecture == "LlamaForCausalLM"


@pytest.mark.parametrize("key", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads"])
def test_a_missing_shape_key_is_an_error_not_a_transformers_default(tmp_path, key):
    cfg = {k: v for k, v in BASE.items() if k != key}
    with pytest.raises(ModelError, match=rf"config\.json: missing key '{key}'"):
        ModelConfig.from_dir(_write(tmp_path, cfg))


def test_bad_values_name_the_file_and_key_and_take_the_callers_error_class(tmp_path):
    _write(tmp_path, {**BASE, "hidden_size": "64x"})
    with pytest.raises(ModelError) as err:
        ModelConfig.from_dir(tmp_path)
    assert str(tmp_path / "config.json") in err.value.message and "hidden_size" in err.value.message
    assert "\n" not in err.value.message
    _write(tmp_path, {**BASE, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})  # llama3 without its keys
    with pytest.raises(ConvertError, match="low_freq_factor|high_freq_factor"):
        ModelConfig.from_dir(tmp_path, ConvertError)
    _write(tmp_path, {**BASE, "num_key_value_heads": 3})
    with pytest.raises(ModelError, match="not a multiple of num_key_value_heads 3"):
        ModelConfig.from_dir(tmp_path)


def test_round_trips_through_transformers_and_tensorrt_llm_spellings():
    from trtspec.convert.llama_tensors import base_config
    from trtspec.convert.mapping import Mapping

    cfg = ModelConfig.from_dict({**BASE, "head_dim": 24, "tie_word_embeddings": True, "rms_norm_eps": 1e-5,
                                 "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **LLAMA3}})
    assert ModelConfig.from_dict(cfg.to_hf_dict()) == cfg
    back = ModelConfig.from_trtllm(base_config(cfg, "float16", Mapping(2, 1), "LlamaForCausalLM"))
    assert back == dataclasses.replace(cfg, torch_dtype="float16")  # the checkpoint's dtype is the converted one


def _transformers_inv_freq(cfg: ModelConfig, seq_len: int) -> torch.Tensor:
    """What transformers' LlamaRotaryEmbedding uses after a forward over `seq_len` positions."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(cfg.to_hf())
    x = torch.zeros(1, seq_len, cfg.head_dim)
    rotary(x, torch.arange(seq_len)[None])
    return rotary.inv_freq


@pytest.mark.parametrize("rope", [None, {"rope_type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0},
                                  {"rope_type": "llama3", **LLAMA3}])
def test_rope_frequencies_are_transformers_own(rope):
    cfg = ModelConfig.from_dict({**BASE, "rope_theta": 500.0, "rope_scaling": rope})
    for max_seq in (8, 16, 40):
        inv_freq, scale = rope_inv_freq(cfg, max_seq)
        assert scale == 1.0
        assert torch.allclose(inv_freq, _transformers_inv_freq(cfg, max_seq), rtol=1e-6, atol=0)


def test_dynamic_rope_is_static_ntk_for_the_whole_cache():
    """Past max_position_embeddings the base is scaled once for the cache length (transformers rescales per
    forward, which would change the frequencies under cached keys); within it, no scaling."""
    cfg = ModelConfig.from_dict({**BASE, "rope_theta": 500.0, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    dim, L = cfg.head_dim, cfg.max_position_embeddings
    plain = 1.0 / (500.0 ** (torch.arange(0, dim, 2).float() / dim))
    assert torch.equal(rope_inv_freq(cfg, L)[0], plain)
    base = 500.0 * ((2.0 * 40 / L) - 1.0) ** (dim / (dim - 2))
    assert torch.allclose(rope_inv_freq(cfg, 40)[0], 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)))
    assert not math.isclose(rope_inv_freq(cfg, 40)[0][-1].item(), plain[-1].item())


def test_runtime_logits_match_transformers_past_max_positions_with_dynamic_rope(tmp_path):
    """One forward over 40 tokens (max_position_embeddings 16, cache of 40): transformers' dynamic NTK for
    that forward is the runtime's static NTK."""
    from trtspec.runtime.cache import chain_inputs
    from trtspec.runtime.llama import Llama

    hf = family.save_llama(tmp_path, seed=3, rope_scaling={"rope_type": "dynamic", "factor": 2.0},
                           max_position_embeddings=16)
    ours = Llama.from_dir(tmp_path, max_seq=40)
    ids = torch.randint(0, family.VOCAB, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
    inp = chain_inputs([0], 40)
    got, _ = ours.forward(ours.new_cache(1), inp.positions, inp.start, inp.mask, tokens=ids)
    assert (got - ref).abs().max().item() <= 1e-4


def test_the_runtime_refuses_what_it_cannot_run_by_capability_not_parsing(tmp_path):
    from trtspec.runtime.llama import check_supported

    gemma = ModelConfig.from_dict({**BASE, "rope_scaling": {"rope_type": "proportional",
                                                             "partial_rotary_factor": 0.5}})
    assert gemma.rope_type == "proportional"  # parsing accepts what transformers accepts (Gemma's rope)
    with pytest.raises(ModelError, match="rope type 'proportional' is not supported"):
        check_supported(gemma)
    with pytest.raises(ModelError, match="hidden_act 'gelu'"):
        check_supported(ModelConfig.from_dict({**BASE, "hidden_act": "gelu"}))
