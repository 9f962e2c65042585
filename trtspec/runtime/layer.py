"""One decoder layer's weights (`LayerWeights`) and their loading from an HF checkpoint (`layer_from_hf`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import torch

from trtspec.artifacts.hf import ModelConfig
from trtspec.errors import ModelError
from trtspec.runtime.architectures import architecture
from trtspec.runtime.linear import Linear


@dataclasses.dataclass
class LayerWeights:
    attn_norm: torch.Tensor | None  # None: no input norm (EAGLE's layer)
    qkv: Linear  # q, k, v fused: [(H + 2*Hkv) * D, hidden]
    o: Linear
    mlp_norm: torch.Tensor
    gate_up: Linear  # gate and up fused: [2 * intermediate, hidden]
    down: Linear
    q_norm: torch.Tensor | None = None  # [head_dim] RMSNorm weights on q and k (Qwen3)
    k_norm: torch.Tensor | None = None
    window: int | None = None  # sliding attention window of this layer (Mistral, Qwen2/3)
    fused: tuple | None = None  # (the fused CPU kernel's op, its weight arguments) when it runs this layer (fused.py)


def layer_from_hf(w: Mapping[str, torch.Tensor], prefix: str, cfg: ModelConfig, dtype, device, *,
                  input_norm: bool = True, weight_dtype: torch.dtype | None = None,
                  window: int | None = None, single_row: bool = False,
                  quantize: Callable[[Linear], object] | None = None, release: bool = False) -> LayerWeights:
    """One decoder layer. Matmul weights are read straight into their dtype (`weight_dtype`, else `dtype`: no
    float32 detour for a bf16 one), norms and biases into `dtype`. `quantize`: turns each new Linear (made
    unpacked) into its quantized twin; `single_row`, `release`: see Linear."""
    mdt = weight_dtype or dtype

    def get(name: str, dt: torch.dtype = dtype) -> torch.Tensor:
        key = prefix + name
        if key not in w:
            raise ModelError(f"checkpoint is missing tensor {key!r}")
        return w[key].to(device=device, dtype=dt)

    def linear(wt: torch.Tensor, b: torch.Tensor | None):
        lin = Linear(wt, b, single_row=single_row, dtype=weight_dtype, pack=quantize is None, release=release)
        return lin if quantize is None else quantize(lin)

    arch = architecture(cfg)
    bias = arch.biases(cfg)

    def opt(name: str, has: bool) -> torch.Tensor | None:  # a bias the architecture has must be there
        return get(name) if has else None

    a = "self_attn."
    q, k, v = get(a + "q_proj.weight", mdt), get(a + "k_proj.weight", mdt), get(a + "v_proj.weight", mdt)
    want = ((cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, cfg.hidden_size)
    wqkv = torch.cat([q, k, v]).contiguous()
    if tuple(wqkv.shape) != want:
        raise ModelError(f"{prefix}self_attn: q/k/v shapes {tuple(q.shape)}/{tuple(k.shape)}/{tuple(v.shape)} "
                         f"do not match the config (heads {cfg.num_heads}, kv heads {cfg.num_kv_heads}, "
                         f"head_dim {cfg.head_dim}, hidden {cfg.hidden_size})")
    bqkv = torch.cat([get(a + "q_proj.bias"), get(a + "k_proj.bias"), get(a + "v_proj.bias")]) if bias["qkv"] else None
    m = "mlp."
    bgu = torch.cat([get(m + "gate_proj.bias"), get(m + "up_proj.bias")]) if bias["mlp"] else None
    del q, k, v
    qkv = linear(wqkv, bqkv)
    del wqkv  # (each linear's source goes as soon as it is packed or quantized: one layer's worth at a time)
    o = linear(get(a + "o_proj.weight", mdt), opt(a + "o_proj.bias", bias["o"]))
    gate_up = linear(torch.cat([get(m + "gate_proj.weight", mdt), get(m + "up_proj.weight", mdt)]).contiguous(), bgu)
    down = linear(get(m + "down_proj.weight", mdt), opt(m + "down_proj.bias", bias["mlp"]))
    return LayerWeights(
        attn_norm=get("input_layernorm.weight") if input_norm else None,
        qkv=qkv, o=o, mlp_norm=get("post_attention_layernorm.weight"), gate_up=gate_up, down=down,
        q_norm=opt(a + "q_norm.weight", arch.qk_norm), k_norm=opt(a + "k_norm.weight", arch.qk_norm),
        window=window,
    )
