"""A compact Llama for the torch runtime (gpt-fast style): HF checkpoint in, logits + hidden states out.

What it reads: an HF Llama directory (`config.json` + `model.safetensors` or sharded safetensors with
`model.safetensors.index.json`). Supported: GQA, `head_dim`, tied embeddings, attention/MLP biases,
RoPE scaling `linear`, `llama3` and `dynamic` (see `rope_inv_freq`).

How it runs: one forward over a batch of rows, each row writing its new tokens' K/V at its own slots of a
pre-allocated static cache (`KVCache`, [layers, batch, kv_heads, max_seq, head_dim]) and attending through an
explicit boolean mask — a causal chain, a padded batch or a draft tree all use the same path. The caller owns
the per-row lengths (see `cache.py`), so rejecting draft tokens is just moving a length pointer back.

dtype: weights are stored in the checkpoint's dtype and cast to the *compute* dtype at load. On CPU the compute
dtype is float32 whatever `spec.model.dtype` says (fp16/bf16 matmuls are slow on CPU and fp32 is what the
logits test checks); on CUDA it is the serving dtype.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trtspec.errors import ModelError

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "linear"|"llama3"|"dynamic", ...}
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "config.json") -> "LlamaConfig":
        model_type = d.get("model_type", "llama")
        if model_type != "llama":
            raise ModelError(f"{where}: model_type {model_type!r} is not supported (only 'llama')",
                             hint="the torch runtime runs Llama-architecture checkpoints")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ModelError(f"{where}: hidden_act {act!r} is not supported (only 'silu')")
        try:
            hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
            rope = dict(d.get("rope_scaling") or d.get("rope_parameters") or {})
            theta = float(d.get("rope_theta") or rope.get("rope_theta") or 10000.0)
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if float(rope.get("partial_rotary_factor", d.get("partial_rotary_factor") or 1.0)) != 1.0:
                raise ModelError(f"{where}: partial_rotary_factor is not supported")
            if rope_type not in ("default", "linear", "llama3", "dynamic"):
                raise ModelError(f"{where}: rope type {rope_type!r} is not supported",
                                 hint="supported: default, linear, llama3, dynamic")
            eos = d.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_layers=int(d["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(d.get("num_key_value_heads") or heads),
                head_dim=int(d.get("head_dim") or hidden // heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=theta,
                rope_scaling=None if rope_type == "default" else {**rope, "rope_type": rope_type},
                max_position_embeddings=int(d.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                attention_bias=bool(d.get("attention_bias", False)),
                mlp_bias=bool(d.get("mlp_bias", False)),
                eos_token_ids=eos_ids,
                bos_token_id=d.get("bos_token_id"),
            )
        except KeyError as exc:
            raise ModelError(f"{where}: missing key {exc.args[0]!r}", hint="is this an HF Llama config?") from None

    @classmethod
    def from_dir(cls, path: str | Path) -> "LlamaConfig":
        return cls.from_dict(read_json(Path(path) / "config.json"), where=str(Path(path) / "config.json"))


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path}: not found", hint="point the spec at an HF checkpoint directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: not valid JSON ({exc})") from None


def load_safetensors(path: str | Path, filename: str = "model.safetensors") -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint dir: `filename`, or the shards listed in `<filename>.index.json`."""
    from safetensors.torch import load_file

    path = Path(path)
    single, index = path / filename, path / f"{filename}.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = [path / f for f in sorted(set(read_json(index)["weight_map"].values()))]
    elif any(path.glob("*.bin")):
        raise ModelError(f"{path}: only PyTorch .bin weights found", hint="save the checkpoint as safetensors")
    else:
        raise ModelError(f"{path}: no {filename} (or {filename}.index.json)")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises its own error types
            raise ModelError(f"{f}: cannot read safetensors ({exc})") from None
    return weights


def compute_dtype(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype:
    """The dtype the runtime computes in: the serving dtype on CUDA, float32 on CPU."""
    dt = _DTYPES[dtype] if isinstance(dtype, str) else dtype
    return dt if torch.device(device).type == "cuda" else torch.float32


# ----------------------------------------------------------------------------------------------------- RoPE

def rope_inv_freq(cfg: LlamaConfig, max_seq: int) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] as transformers computes them for each rope type.

    `dynamic` (NTK) rescales the base once the sequence outgrows `max_position_embeddings`; transformers does
    that per forward call, which changes the frequencies under already-cached keys. Here the frequencies are
    fixed: identical to transformers up to `max_position_embeddings`, and for longer engines scaled for
    `max_seq` (static NTK) from the start.
    """
    dim, base = cfg.head_dim, cfg.rope_theta
    rs = cfg.rope_scaling or {"rope_type": "default"}
    kind = rs["rope_type"]
    if kind == "dynamic" and max_seq > cfg.max_position_embeddings:
        factor = float(rs["factor"])
        base = base * ((factor * max_seq / cfg.max_position_embeddings) - (factor - 1)) ** (dim / (dim - 2))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    if kind == "linear":
        inv_freq = inv_freq / float(rs["factor"])
    elif kind == "llama3":
        factor, low, high = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old_len = float(rs.get("original_max_position_embeddings", cfg.max_position_embeddings))
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv_freq = torch.where(is_medium, smoothed, scaled)
    return inv_freq


def rope_tables(cfg: LlamaConfig, max_seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos [max_seq, D] and the sign-folded sin [max_seq, D] so that rope(x) = x*cos + roll(x, D/2)*sin."""
    inv_freq = rope_inv_freq(cfg, max_seq)
    freqs = torch.arange(max_seq, dtype=torch.float)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    half = cfg.head_dim // 2
    sin = emb.sin()
    sin[:, :half] = -sin[:, :half]  # rotate_half(x) = cat(-x2, x1) = roll(x, D/2) * [-1.., +1..]
    return emb.cos(), sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin


# ------------------------------------------------------------------------------------------------- the model

@dataclasses.dataclass
class LayerWeights:
    attn_norm: torch.Tensor | None  # None: no input norm (EAGLE's layer)
    wqkv: torch.Tensor  # [(H + 2*Hkv) * D, hidden]
    bqkv: torch.Tensor | None
    wo: torch.Tensor
    bo: torch.Tensor | None
    mlp_norm: torch.Tensor
    w13: torch.Tensor  # gate and up fused: [2 * intermediate, hidden]
    b13: torch.Tensor | None
    w2: torch.Tensor
    b2: torch.Tensor | None


def layer_from_hf(w: dict[str, torch.Tensor], prefix: str, cfg: LlamaConfig, dtype, device, *,
                  input_norm: bool = True) -> LayerWeights:
    def get(name: str) -> torch.Tensor:
        key = prefix + name
        if key not in w:
            raise ModelError(f"checkpoint is missing tensor {key!r}")
        return w[key].to(device=device, dtype=dtype)

    def opt(name: str) -> torch.Tensor | None:
        return get(name) if prefix + name in w else None

    a = "self_attn."
    q, k, v = get(a + "q_proj.weight"), get(a + "k_proj.weight"), get(a + "v_proj.weight")
    want = ((cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, cfg.hidden_size)
    wqkv = torch.cat([q, k, v]).contiguous()
    if tuple(wqkv.shape) != want:
        raise ModelError(f"{prefix}self_attn: q/k/v shapes {tuple(q.shape)}/{tuple(k.shape)}/{tuple(v.shape)} "
                         f"do not match the config (heads {cfg.num_heads}, kv heads {cfg.num_kv_heads}, "
                         f"head_dim {cfg.head_dim}, hidden {cfg.hidden_size})")
    bq = opt(a + "q_proj.bias")
    bqkv = torch.cat([bq, get(a + "k_proj.bias"), get(a + "v_proj.bias")]) if bq is not None else None
    m = "mlp."
    bg = opt(m + "gate_proj.bias")
    return LayerWeights(
        attn_norm=get("input_layernorm.weight") if input_norm else None,
        wqkv=wqkv, bqkv=bqkv,
        wo=get(a + "o_proj.weight"), bo=opt(a + "o_proj.bias"),
        mlp_norm=get("post_attention_layernorm.weight"),
        w13=torch.cat([get(m + "gate_proj.weight"), get(m + "up_proj.weight")]).contiguous(),
        b13=torch.cat([bg, get(m + "up_proj.bias")]) if bg is not None else None,
        w2=get(m + "down_proj.weight"), b2=opt(m + "down_proj.bias"),
    )


class Llama:
    """Weights + a forward over the static KV cache. Not an nn.Module: plain tensors, no hooks, no grads."""

    def __init__(self, cfg: LlamaConfig, weights: dict[str, torch.Tensor], *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", max_seq: int = 4096, name: str = "model",
                 prefix: str = "model.", input_norm: bool = True, final_norm: bool = True,
                 embed: torch.Tensor | None = None, lm_head: torch.Tensor | None = None):
        """`prefix`, `input_norm`, `final_norm`, `embed`, `lm_head` let a draft head (EAGLE: one layer without
        input norm or final norm, reusing the target's embeddings and LM head) use the same code."""
        self.cfg, self.dtype, self.device, self.name = cfg, dtype, torch.device(device), name

        def get(key: str) -> torch.Tensor:
            if key not in weights:
                raise ModelError(f"{name}: checkpoint is missing tensor {key!r}")
            return weights[key].to(device=device, dtype=dtype)

        self.embed = embed if embed is not None else get(prefix + "embed_tokens.weight")
        if tuple(self.embed.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ModelError(f"{name}: embed_tokens shape {tuple(self.embed.shape)} does not match the config "
                             f"(vocab {cfg.vocab_size}, hidden {cfg.hidden_size})")
        self.layers = [layer_from_hf(weights, f"{prefix}layers.{i}.", cfg, dtype, device, input_norm=input_norm)
                       for i in range(cfg.num_layers)]
        self.norm = get(prefix + "norm.weight") if final_norm else None
        if lm_head is not None:
            self.lm_head = lm_head
        elif "lm_head.weight" in weights:
            self.lm_head = get("lm_head.weight")
        elif cfg.tie_word_embeddings:
            self.lm_head = self.embed
        else:
            raise ModelError(f"{name}: no lm_head.weight and tie_word_embeddings is false")
        self.set_max_seq(max_seq)

    def set_max_seq(self, max_seq: int) -> None:
        """Size the RoPE tables for positions < max_seq (the cache's slot count)."""
        self.max_seq = max_seq
        cos, sin = rope_tables(self.cfg, max_seq)
        self.cos, self.sin = cos.to(device=self.device, dtype=self.dtype), sin.to(device=self.device, dtype=self.dtype)

    @classmethod
    def from_dir(cls, path: str | Path, *, dtype: str | torch.dtype = "float32", device: str = "cpu",
                 max_seq: int = 4096, name: str | None = None) -> "Llama":
        cfg = LlamaConfig.from_dir(path)
        return cls(cfg, load_safetensors(path), dtype=compute_dtype(dtype, device), device=device,
                   max_seq=max_seq, name=name or Path(path).name)

    @property
    def num_params(self) -> int:
        ts = [self.embed, self.lm_head] if self.lm_head is not self.embed else [self.embed]
        for lw in self.layers:
            ts += [t for t in dataclasses.astuple(lw) if isinstance(t, torch.Tensor)]
        return sum(t.numel() for t in ts)

    def new_cache(self, batch: int, max_seq: int | None = None):
        from trtspec.runtime.cache import KVCache

        c = self.cfg
        return KVCache(c.num_layers, batch, c.num_kv_heads, max_seq or self.max_seq, c.head_dim,
                       dtype=self.dtype, device=self.device)

    def forward(self, cache, positions: torch.Tensor, start: list[int], mask: torch.Tensor | None, *,
                tokens: torch.Tensor | None = None, embeds: torch.Tensor | None = None, row0: int = 0,
                logits_at: torch.Tensor | None = None, logits: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Run rows row0..row0+B-1 of the cache on new inputs.

        positions [B, T]: RoPE positions; row b writes its T new K/V entries at cache slots start[b]..start[b]+T-1.
        mask [B, 1, T, S] (bool, True = attend) over cache slots 0..S-1, or None to attend to all S = start[0]+T
        slots (one row). tokens [B, T] or embeds [B, T, hidden]. logits_at [B, M]: token indices whose logits
        are wanted (default: all). Returns (logits [B, M, V] | None, final (post-norm) hidden [B, T, hidden]).
        """
        x = F.embedding(tokens, self.embed) if embeds is None else embeds
        h = self.hidden(x, cache, positions, start, mask, row0=row0)
        if self.norm is not None:
            h = F.rms_norm(h, (self.cfg.hidden_size,), self.norm, self.cfg.rms_norm_eps)
        if not logits:
            return None, h
        hs = h if logits_at is None else h.gather(1, logits_at[..., None].expand(-1, -1, h.shape[-1]))
        return F.linear(hs, self.lm_head), h

    def hidden(self, x: torch.Tensor, cache, positions, start: list[int], mask, *, row0: int = 0,
               layers: list[LayerWeights] | None = None) -> torch.Tensor:
        """The decoder stack (no final norm) over `x` [B, T, hidden]."""
        B, T = positions.shape
        S = mask.shape[-1] if mask is not None else start[0] + T
        cos, sin = self.cos[positions].unsqueeze(2), self.sin[positions].unsqueeze(2)
        write = _writer(start, T, B, row0, self.device)
        for i, lw in enumerate(layers if layers is not None else self.layers):
            x = self.block(x, lw, cache.k[i], cache.v[i], cos, sin, write, mask, B, T, S, row0)
        return x

    def block(self, x, w: LayerWeights, kc, vc, cos, sin, write, mask, B, T, S, row0):
        c = self.cfg
        nh, nkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        h = x if w.attn_norm is None else F.rms_norm(x, (c.hidden_size,), w.attn_norm, c.rms_norm_eps)
        qkv = F.linear(h, w.wqkv, w.bqkv).view(B, T, nh + 2 * nkv, D)
        qk = apply_rope(qkv[:, :, : nh + nkv], cos, sin)
        write(kc, qk[:, :, nh:])
        write(vc, qkv[:, :, nh + nkv:])
        o = F.scaled_dot_product_attention(
            qk[:, :, :nh].transpose(1, 2), kc[row0:row0 + B, :, :S], vc[row0:row0 + B, :, :S],
            attn_mask=mask, enable_gqa=nh != nkv)
        x = x + F.linear(o.transpose(1, 2).reshape(B, T, nh * D), w.wo, w.bo)
        h = F.rms_norm(x, (c.hidden_size,), w.mlp_norm, c.rms_norm_eps)
        gate, up = F.linear(h, w.w13, w.b13).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w.w2, w.b2)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.lm_head)


def _writer(start: list[int], T: int, B: int, row0: int, device):
    """A function writing new K or V [B, T, Hkv, D] into a cache layer at each row's slots start[b]..+T-1."""
    if B == 1:
        s, r = start[0], row0

        def write_one(cache_layer: torch.Tensor, new: torch.Tensor) -> None:
            cache_layer[r, :, s:s + T] = new[0].transpose(0, 1)
        return write_one
    rows = torch.arange(row0, row0 + B, device=device)[:, None]
    slots = torch.tensor(start, device=device)[:, None] + torch.arange(T, device=device)[None, :]

    def write_many(cache_layer: torch.Tensor, new: torch.Tensor) -> None:
        cache_layer[rows, :, slots] = new
    return write_many
