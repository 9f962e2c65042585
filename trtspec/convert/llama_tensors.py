"""HF Llama (+ Medusa heads, + EAGLE-1 head) -> TensorRT-LLM checkpoint tensors, per rank.

Names and splits follow NVIDIA/TensorRT-LLM's own converters (at commit 0afa06ab:
`tensorrt_llm/models/llama/convert.py`, `tensorrt_llm/models/medusa/weight.py`, `examples/eagle/convert_checkpoint.py`):

    transformer.vocab_embedding.weight          model.embed_tokens.weight   first PP stage, not split
    transformer.layers.{i}.input_layernorm      input_layernorm             replicated
    transformer.layers.{i}.attention.qkv        cat(q_r, k_r, v_r)          q, k, v each split on dim 0
    transformer.layers.{i}.attention.dense      self_attn.o_proj            split on dim 1 (bias replicated)
    transformer.layers.{i}.post_layernorm       post_attention_layernorm    replicated
    transformer.layers.{i}.mlp.fc               mlp.gate_proj               split on dim 0
    transformer.layers.{i}.mlp.gate             mlp.up_proj                 split on dim 0
    transformer.layers.{i}.mlp.proj             mlp.down_proj               split on dim 1 (bias replicated)
    transformer.ln_f.weight                     model.norm.weight           last PP stage
    lm_head.weight                              lm_head (or embed if tied)  last PP stage, padded to a
                                                                            multiple of tp, split on dim 0
    medusa_heads.{h}.medusa_layers.{l}.linear   {h}.{l}.linear              split on dim 0 (weight, bias)
    medusa_heads.{h}.lm_head.weight             {h}.{L}.weight              padded, split on dim 0
    eagle_nets.{n}.drafter.fc                   fc                          split on dim 0 (weight, bias; zeros
                                                                            when the head has none)
    eagle_nets.{n}.drafter.vocab_embedding      target embed_tokens         not split
    eagle_nets.{n}.drafter.layers.{j}.*         layers.{j}.*                as the target's layers
    eagle_nets.{n}.lm_head.weight               target lm_head              padded, split on dim 0

`i` is the layer index LOCAL to the pipeline stage.
"""

from __future__ import annotations

from typing import Any

import torch

from trtspec.convert import sharding as sh
from trtspec.artifacts.hf import ModelConfig
from trtspec.convert.hf import need, rope_scaling
from trtspec.errors import ConvertError

Tensors = dict[str, torch.Tensor]

# (TensorRT-LLM suffix, HF suffix, how it is split) for everything in a decoder layer but qkv.
# split: "col" = dim 0, "row" = dim 1, "rep" = replicated.
_LAYER_MAP = [
    ("input_layernorm.weight", "input_layernorm.weight", "rep"),
    ("attention.dense.weight", "self_attn.o_proj.weight", "row"),
    ("attention.dense.bias", "self_attn.o_proj.bias", "rep"),
    ("post_layernorm.weight", "post_attention_layernorm.weight", "rep"),
    ("mlp.fc.weight", "mlp.gate_proj.weight", "col"),
    ("mlp.fc.bias", "mlp.gate_proj.bias", "col"),
    ("mlp.gate.weight", "mlp.up_proj.weight", "col"),
    ("mlp.gate.bias", "mlp.up_proj.bias", "col"),
    ("mlp.proj.weight", "mlp.down_proj.weight", "row"),
    ("mlp.proj.bias", "mlp.down_proj.bias", "rep"),
]


# ------------------------------------------------------------------------------------- configs


def base_config(shape: ModelConfig, dtype: str, mapping: sh.Mapping, architecture: str) -> dict[str, Any]:
    """The `config.json` keys TensorRT-LLM's PretrainedConfig/LLaMAConfig read (§1.2)."""
    return {
        "architecture": architecture,
        "dtype": dtype,
        "logits_dtype": "float32",
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "hidden_size": shape.hidden_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_size": shape.head_dim,
        "hidden_act": shape.hidden_act,
        "intermediate_size": shape.intermediate_size,
        "norm_epsilon": shape.rms_norm_eps,
        "position_embedding_type": "rope_gpt_neox",
        "rotary_base": shape.rope_theta,
        "rotary_scaling": rope_scaling(shape),
        "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        "mapping": mapping.to_config(),
        "use_parallel_embedding": False,
        "embedding_sharding_dim": 0,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "attn_bias": shape.attention_bias,
        "mlp_bias": shape.mlp_bias,
    }


def medusa_config(shape: ModelConfig, dtype: str, mapping: sh.Mapping, *, num_heads: int, num_layers: int,
                  max_draft_len: int) -> dict[str, Any]:
    cfg = base_config(shape, dtype, mapping, "MedusaForCausalLM")
    cfg.update(max_draft_len=max_draft_len, num_medusa_heads=num_heads, num_medusa_layers=num_layers,
               model_type="llama")
    return cfg


def eagle_config(shape: ModelConfig, eagle: ModelConfig, dtype: str, mapping: sh.Mapping, *, max_draft_len: int,
                 num_eagle_layers: int, max_non_leaves_per_layer: int) -> dict[str, Any]:
    """(trtspec/methods/eagle.py refuses pipeline parallelism and a max_draft_len over TensorRT-LLM's limit.)"""
    net = base_config(eagle, dtype, mapping, "LlamaForCausalLM")
    net["vocab_size"] = shape.vocab_size
    net["head_dim"] = eagle.head_dim
    cfg = base_config(shape, dtype, mapping, "EagleForCausalLM")
    cfg.update(max_draft_len=max_draft_len, num_eagle_layers=num_eagle_layers,
               max_non_leaves_per_layer=max_non_leaves_per_layer, eagle_net_config=net, head_dim=shape.head_dim)
    return cfg


# -------------------------------------------------------------------------------- HF -> ranks


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t.to(dtype).contiguous()


def _split_by(kind: str, t: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    if kind == "col":
        return sh.split(t, tp, rank, 0)
    if kind == "row":
        return sh.split(t, tp, rank, 1)
    return t.clone().contiguous()


def layer_weights(sd: Tensors, hf_prefix: str, shape: ModelConfig, tp: int, rank: int, dtype: torch.dtype,
                  where: str, *, input_norm: bool = True) -> Tensors:
    """One decoder layer for one TP rank, TensorRT-LLM suffixes (no prefix)."""
    H, q, kv = shape.hidden_size, shape.q_size, shape.kv_size
    if shape.num_heads % tp:
        raise ConvertError(f"{where}: {shape.num_heads} attention heads cannot be split over "
                           f"tensor_parallel={tp}", hint="choose a tensor_parallel size that divides the heads")
    out: Tensors = {}
    wq = need(sd, hf_prefix + "self_attn.q_proj.weight", where, (q, H))
    wk = need(sd, hf_prefix + "self_attn.k_proj.weight", where, (kv, H))
    wv = need(sd, hf_prefix + "self_attn.v_proj.weight", where, (kv, H))
    nkv = shape.num_kv_heads
    out["attention.qkv.weight"] = _cast(torch.cat([sh.split(wq, tp, rank), sh.split_kv(wk, nkv, tp, rank),
                                                   sh.split_kv(wv, nkv, tp, rank)]), dtype)
    if hf_prefix + "self_attn.q_proj.bias" in sd:
        bq, bk, bv = (need(sd, hf_prefix + f"self_attn.{p}_proj.bias", where) for p in "qkv")
        out["attention.qkv.bias"] = _cast(torch.cat([sh.split(bq, tp, rank), sh.split_kv(bk, nkv, tp, rank),
                                                     sh.split_kv(bv, nkv, tp, rank)]), dtype)
    for trt, hf, kind in _LAYER_MAP:
        key = hf_prefix + hf
        if trt == "input_layernorm.weight" and not input_norm:
            continue
        if key not in sd:
            if trt.endswith(".bias"):
                continue
            need(sd, key, where)
        if trt in ("mlp.fc.weight", "mlp.gate.weight", "mlp.proj.weight") and shape.intermediate_size % tp:
            raise ConvertError(f"{where}: intermediate_size {shape.intermediate_size} cannot be split over "
                               f"tensor_parallel={tp}", hint="choose a tensor_parallel size that divides it")
        out[trt] = _cast(_split_by(kind, sd[key], tp, rank), dtype)
    return out


def base_rank_weights(sd: Tensors, shape: ModelConfig, mapping: sh.Mapping, tp_rank: int, pp_rank: int,
                      dtype: torch.dtype, where: str) -> Tensors:
    tp = mapping.tp_size
    out: Tensors = {}
    V, H = shape.vocab_size, shape.hidden_size
    embed = need(sd, "model.embed_tokens.weight", where, (V, H))
    if pp_rank == 0:
        out["transformer.vocab_embedding.weight"] = _cast(embed, dtype)
    layers = sh.pp_layers(shape.num_layers, mapping.pp_size, pp_rank)
    for local, layer in enumerate(layers):
        for k, v in layer_weights(sd, f"model.layers.{layer}.", shape, tp, tp_rank, dtype, where).items():
            out[f"transformer.layers.{local}.{k}"] = v
    if pp_rank == mapping.pp_size - 1:
        out["transformer.ln_f.weight"] = _cast(need(sd, "model.norm.weight", where, (H,)), dtype)
        head = sd.get("lm_head.weight")
        if shape.tie_word_embeddings or head is None:
            if head is not None and not torch.equal(head, embed):
                raise ConvertError(f"{where}: tie_word_embeddings is set but lm_head differs from embed_tokens",
                                   hint="fix tie_word_embeddings in config.json")
            if head is None and not shape.tie_word_embeddings:
                need(sd, "lm_head.weight", where)
            head = embed
        need({"lm_head.weight": head}, "lm_head.weight", where, (V, H))
        out["lm_head.weight"] = _cast(sh.split_vocab(head, tp, tp_rank), dtype)
    return out


def medusa_rank_weights(heads: Tensors, shape: ModelConfig, mapping: sh.Mapping, tp_rank: int, pp_rank: int,
                        num_heads: int, num_layers: int, dtype: torch.dtype, where: str) -> Tensors:
    if pp_rank != mapping.pp_size - 1:
        return {}
    tp, H, V = mapping.tp_size, shape.hidden_size, shape.vocab_size
    out: Tensors = {}
    for h in range(num_heads):
        for l in range(num_layers):
            w = need(heads, f"{h}.{l}.linear.weight", where, (H, H))
            out[f"medusa_heads.{h}.medusa_layers.{l}.linear.weight"] = _cast(sh.split(w, tp, tp_rank), dtype)
            b = need(heads, f"{h}.{l}.linear.bias", where, (H,))
            out[f"medusa_heads.{h}.medusa_layers.{l}.linear.bias"] = _cast(sh.split(b, tp, tp_rank), dtype)
        lm = need(heads, f"{h}.{num_layers}.weight", where, (V, H))
        out[f"medusa_heads.{h}.lm_head.weight"] = _cast(sh.split_vocab(lm, tp, tp_rank), dtype)
    return out


def eagle_rank_weights(eagle: Tensors, eagle_shape: ModelConfig, target: Tensors, shape: ModelConfig,
                       mapping: sh.Mapping, tp_rank: int, num_eagle_layers: int, dtype: torch.dtype,
                       where: str) -> Tensors:
    tp, H = mapping.tp_size, shape.hidden_size
    fc_w = need(eagle, "fc.weight", where, (H, 2 * H))
    per_net: Tensors = {"drafter.fc.weight": _cast(sh.split(fc_w, tp, tp_rank), dtype)}
    # TensorRT-LLM's EAGLE drafter declares fc with bias=True (models/llama/model.py, `fc_after_embed`; its
    # loader reads fc.bias unconditionally): a bias-less head gets zeros, which compute the same fc.
    bias = need(eagle, "fc.bias", where, (H,)) if "fc.bias" in eagle else torch.zeros(H, dtype=fc_w.dtype)
    per_net["drafter.fc.bias"] = _cast(sh.split(bias, tp, tp_rank), dtype)
    embed = eagle.get("embed_tokens.weight", target["model.embed_tokens.weight"])
    per_net["drafter.vocab_embedding.weight"] = _cast(embed, dtype)
    for j in range(eagle_shape.num_layers):
        layer = layer_weights(eagle, f"layers.{j}.", eagle_shape, tp, tp_rank, dtype, where, input_norm=j > 0)
        per_net.update({f"drafter.layers.{j}.{k}": v for k, v in layer.items()})
    head = target.get("lm_head.weight")
    if head is None or shape.tie_word_embeddings:
        head = target["model.embed_tokens.weight"]
    per_net["lm_head.weight"] = _cast(sh.split_vocab(head, tp, tp_rank), dtype)
    return {f"eagle_nets.{n}.{k}": v.clone() for n in range(num_eagle_layers) for k, v in per_net.items()}


# -------------------------------------------------------------------------------- ranks -> HF


def _layer_from_ranks(parts: list[Tensors], prefix: str, shape: ModelConfig, tp: int, dtype: torch.dtype,
                      hf_prefix: str) -> Tensors:
    out: Tensors = {}
    qr = shape.q_size // tp
    kvr = sh.kv_heads_per_rank(shape.num_kv_heads, tp) * shape.head_dim
    for suffix in ("weight", "bias"):
        key = f"{prefix}attention.qkv.{suffix}"
        if key not in parts[0]:
            continue
        qs, ks, vs = zip(*(torch.split(p[key], [qr, kvr, kvr], dim=0) for p in parts))
        out[f"{hf_prefix}self_attn.q_proj.{suffix}"] = sh.merge(list(qs))
        out[f"{hf_prefix}self_attn.k_proj.{suffix}"] = sh.merge_kv(list(ks), shape.num_kv_heads, tp)
        out[f"{hf_prefix}self_attn.v_proj.{suffix}"] = sh.merge_kv(list(vs), shape.num_kv_heads, tp)
    for trt, hf, kind in _LAYER_MAP:
        key = prefix + trt
        if key not in parts[0]:
            continue
        ts = [p[key] for p in parts]
        if kind == "col":
            out[hf_prefix + hf] = sh.merge(ts, 0)
        elif kind == "row":
            out[hf_prefix + hf] = sh.merge(ts, 1)
        else:
            out[hf_prefix + hf] = sh.same_on_all(ts, key)
    return out


def rank_parts(ranks: dict[int, Tensors], mapping: sh.Mapping, pp_rank: int) -> list[Tensors]:
    return [ranks[pp_rank * mapping.tp_size + t] for t in range(mapping.tp_size)]


def base_from_ranks(ranks: dict[int, Tensors], config: dict[str, Any], shape: ModelConfig,
                    mapping: sh.Mapping) -> Tensors:
    tp, pp = mapping.tp_size, mapping.pp_size
    out: Tensors = {}
    first = rank_parts(ranks, mapping, 0)
    out["model.embed_tokens.weight"] = sh.same_on_all([p["transformer.vocab_embedding.weight"] for p in first],
                                                      "transformer.vocab_embedding.weight")
    for p in range(pp):
        parts = rank_parts(ranks, mapping, p)
        for local, layer in enumerate(sh.pp_layers(shape.num_layers, pp, p)):
            out.update(_layer_from_ranks(parts, f"transformer.layers.{local}.", shape, tp, None,
                                         f"model.layers.{layer}."))
    last = rank_parts(ranks, mapping, pp - 1)
    out["model.norm.weight"] = sh.same_on_all([p["transformer.ln_f.weight"] for p in last], "transformer.ln_f.weight")
    head = sh.merge_vocab([p["lm_head.weight"] for p in last], shape.vocab_size)
    if config.get("tie_word_embeddings"):
        if not torch.equal(head, out["model.embed_tokens.weight"]):
            raise ConvertError("tie_word_embeddings is set but lm_head differs from the embedding",
                               hint="the checkpoint was not written by a consistent converter")
    else:
        out["lm_head.weight"] = head
    return out


def medusa_from_ranks(ranks: dict[int, Tensors], config: dict[str, Any], mapping: sh.Mapping) -> Tensors:
    last = rank_parts(ranks, mapping, mapping.pp_size - 1)
    out: Tensors = {}
    L = config["num_medusa_layers"]
    for h in range(config["num_medusa_heads"]):
        for l in range(L):
            base = f"medusa_heads.{h}.medusa_layers.{l}.linear."
            out[f"{h}.{l}.linear.weight"] = sh.merge([p[base + "weight"] for p in last])
            out[f"{h}.{l}.linear.bias"] = sh.merge([p[base + "bias"] for p in last])
        out[f"{h}.{L}.weight"] = sh.merge_vocab([p[f"medusa_heads.{h}.lm_head.weight"] for p in last],
                                                config["vocab_size"])
    return out


def eagle_from_ranks(ranks: dict[int, Tensors], config: dict[str, Any], eagle_shape: ModelConfig,
                     mapping: sh.Mapping, target_embed: torch.Tensor) -> Tensors:
    parts = rank_parts(ranks, mapping, 0)
    tp = mapping.tp_size
    n_nets = config["num_eagle_layers"]
    for n in range(1, n_nets):  # every EagleNet holds the same drafter weights
        for p in parts:
            for k, v in p.items():
                if k.startswith("eagle_nets.0."):
                    other = p[k.replace("eagle_nets.0.", f"eagle_nets.{n}.", 1)]
                    if not torch.equal(v, other):
                        raise ConvertError(f"EAGLE net {n} differs from net 0 at {k}",
                                           hint="the checkpoint was not written by a consistent converter")
    pre = "eagle_nets.0.drafter."
    out: Tensors = {"fc.weight": sh.merge([p[pre + "fc.weight"] for p in parts])}
    if pre + "fc.bias" in parts[0]:
        out["fc.bias"] = sh.merge([p[pre + "fc.bias"] for p in parts])
    embed = sh.same_on_all([p[pre + "vocab_embedding.weight"] for p in parts], pre + "vocab_embedding.weight")
    if not torch.equal(embed, target_embed):
        out["embed_tokens.weight"] = embed
    for j in range(eagle_shape.num_layers):
        out.update(_layer_from_ranks(parts, f"{pre}layers.{j}.", eagle_shape, tp, None, f"layers.{j}."))
    return out

