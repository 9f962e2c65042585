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
import functools
import json
import math
import os
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

    @property
    def num_params(self) -> int:
        """Parameters of the matmul weights (embeddings and LM head included, norms not)."""
        attn = self.hidden_size * (2 * self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        mlp = 3 * self.hidden_size * self.intermediate_size
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.num_layers * (attn + mlp) + self.vocab_size * self.hidden_size + head

    @classmethod
    def from_dir(cls, path: str | Path) -> "LlamaConfig":
        return cls.from_dict(read_json(Path(path) / "config.json"), where=str(Path(path) / "config.json"))


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"{path}: not found", hint="point the spec at an HF checkpoint directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: not valid JSON ({exc})", hint="re-export the checkpoint") from None
    if not isinstance(data, dict):  # every caller indexes it as an object
        raise ModelError(f"{path}: not a JSON object", hint="re-export the checkpoint")
    return data


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
    """The dtype the target computes in: the serving dtype on CUDA, float32 on CPU."""
    dt = _DTYPES[dtype] if isinstance(dtype, str) else dtype
    return dt if torch.device(device).type == "cuda" else torch.float32


BF16_MIN_BYTES = 8 << 20  # drafter matmul weights (in fp32) below this stay fp32: casts would cost more


def draft_dtype(dtype: str | torch.dtype, device: str | torch.device, nbytes: int | None = None) -> torch.dtype:
    """The dtype of drafters' matmul weights. Drafts only propose; the target's verification keeps the output
    exact (greedy identity; sampling uses the very q a draft was sampled from), so on CPUs with native bf16
    (avx512_bf16/AMX) drafter weights are bfloat16 — half the memory traffic of their matmuls, while
    activations, norms, attention and the KV cache stay float32 (bf16 attention is slow on CPU). Small
    drafters (`nbytes` of fp32 weights < BF16_MIN_BYTES: cache-resident, cast-bound) stay float32, as do CPUs
    without native bf16. `TRTSPEC_DRAFT_DTYPE=float32|bfloat16` forces a choice."""
    forced = os.environ.get("TRTSPEC_DRAFT_DTYPE")
    if forced:
        return _DTYPES[forced]
    big = nbytes is None or nbytes >= BF16_MIN_BYTES
    if torch.device(device).type == "cpu" and big and cpu_has_fast_bf16():
        return torch.bfloat16
    return compute_dtype(dtype, device)


@functools.lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
        return (" avx512_bf16" in flags or " amx_bf16" in flags) and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (OSError, RuntimeError, AttributeError):
        return False


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

ONEDNN_SINGLE_ROW_BYTES = 16 << 20  # models larger than this (half a typical L3) use oneDNN for one row too


class Linear:
    """y = x W^T + b. On CPU the weight is also kept prepacked for oneDNN, which multiplies several rows (a
    verify pass, a prefill) 2-7x faster than MKL's GEMM on this project's CPUs. For one row (a decode step)
    oneDNN wins on weights streamed from memory (a large model: ~1.7x), MKL on small, cache-resident ones:
    `single_row` picks oneDNN for one row too (Llama decides by model size). A weight stored in another dtype
    than the input (bf16 drafter weights) is multiplied in that dtype: input cast in, output cast back."""

    __slots__ = ("w", "b", "packed", "min_rows")

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None, single_row: bool = False,
                 dtype: torch.dtype | None = None):
        if dtype is not None:
            w, b = w.to(dtype), (None if b is None else b.to(dtype))
        self.w, self.b = w, b
        self.packed = _onednn_pack(w)
        self.min_rows = 1 if single_row or w.dtype == torch.bfloat16 else 2

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        dt = x.dtype
        if dt != self.w.dtype:
            return self(x.to(self.w.dtype)).to(dt)
        if self.packed is not None and x.numel() >= self.min_rows * x.shape[-1]:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.b, "none", [], "")
        return F.linear(x, self.w, self.b)


def _onednn_pack(w: torch.Tensor):
    if w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        probe = torch.ones(2, w.shape[1], dtype=w.dtype)
        tol = 1e-4 if w.dtype == torch.float32 else 2e-2
        if not torch.allclose(torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "").float(),
                              F.linear(probe, w).float(), rtol=tol, atol=tol):
            return None
        return packed
    except (RuntimeError, AttributeError):  # torch without these oneDNN ops: plain F.linear
        return None


@dataclasses.dataclass
class LayerWeights:
    attn_norm: torch.Tensor | None  # None: no input norm (EAGLE's layer)
    qkv: Linear  # q, k, v fused: [(H + 2*Hkv) * D, hidden]
    o: Linear
    mlp_norm: torch.Tensor
    gate_up: Linear  # gate and up fused: [2 * intermediate, hidden]
    down: Linear


def layer_from_hf(w: dict[str, torch.Tensor], prefix: str, cfg: LlamaConfig, dtype, device, *,
                  input_norm: bool = True, weight_dtype: torch.dtype | None = None) -> LayerWeights:
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
        qkv=Linear(wqkv, bqkv, dtype=weight_dtype),
        o=Linear(get(a + "o_proj.weight"), opt(a + "o_proj.bias"), dtype=weight_dtype),
        mlp_norm=get("post_attention_layernorm.weight"),
        gate_up=Linear(torch.cat([get(m + "gate_proj.weight"), get(m + "up_proj.weight")]).contiguous(),
                       torch.cat([bg, get(m + "up_proj.bias")]) if bg is not None else None, dtype=weight_dtype),
        down=Linear(get(m + "down_proj.weight"), opt(m + "down_proj.bias"), dtype=weight_dtype),
    )


class Llama:
    """Weights + a forward over the static KV cache. Not an nn.Module: plain tensors, no hooks, no grads."""

    def __init__(self, cfg: LlamaConfig, weights: dict[str, torch.Tensor], *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", max_seq: int = 4096, name: str = "model",
                 prefix: str = "model.", input_norm: bool = True, final_norm: bool = True,
                 embed: torch.Tensor | None = None, lm_head: torch.Tensor | None = None,
                 weight_dtype: torch.dtype | None = None):
        """`prefix`, `input_norm`, `final_norm`, `embed`, `lm_head` let a draft head (EAGLE: one layer without
        input norm or final norm, reusing the target's embeddings and LM head) use the same code.
        weight_dtype: dtype of the matmul weights if not `dtype` (bf16 drafters, see draft_dtype)."""
        self.cfg, self.dtype, self.device, self.name = cfg, dtype, torch.device(device), name

        def get(key: str) -> torch.Tensor:
            if key not in weights:
                raise ModelError(f"{name}: checkpoint is missing tensor {key!r}")
            return weights[key].to(device=device, dtype=dtype)

        self.embed = embed if embed is not None else get(prefix + "embed_tokens.weight")
        if tuple(self.embed.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ModelError(f"{name}: embed_tokens shape {tuple(self.embed.shape)} does not match the config "
                             f"(vocab {cfg.vocab_size}, hidden {cfg.hidden_size})")
        self.layers = [layer_from_hf(weights, f"{prefix}layers.{i}.", cfg, dtype, device, input_norm=input_norm,
                                     weight_dtype=weight_dtype) for i in range(cfg.num_layers)]
        self.norm = get(prefix + "norm.weight") if final_norm else None
        if lm_head is not None:
            self.lm_head = lm_head
        elif "lm_head.weight" in weights:
            self.lm_head = get("lm_head.weight")
        elif cfg.tie_word_embeddings:
            self.lm_head = self.embed
        else:
            raise ModelError(f"{name}: no lm_head.weight and tie_word_embeddings is false")
        self.head = Linear(self.lm_head, dtype=weight_dtype)
        bytes_per = (weight_dtype or dtype).itemsize
        if self.num_params * bytes_per > ONEDNN_SINGLE_ROW_BYTES:
            self.use_onednn_single_row(True)
        self.set_max_seq(max_seq)

    def use_onednn_single_row(self, on: bool) -> None:
        for lin in [self.head] + [x for lw in self.layers for x in (lw.qkv, lw.o, lw.gate_up, lw.down)]:
            lin.min_rows = 1 if on or lin.w.dtype == torch.bfloat16 else 2

    def set_max_seq(self, max_seq: int) -> None:
        """Size the RoPE tables for positions < max_seq (the cache's slot count)."""
        self.max_seq = max_seq
        cos, sin = rope_tables(self.cfg, max_seq)
        self.rope = torch.cat([cos, sin], -1).to(device=self.device, dtype=self.dtype)  # [max_seq, 2D]: one gather

    @classmethod
    def from_dir(cls, path: str | Path, *, dtype: str | torch.dtype = "float32", device: str = "cpu",
                 max_seq: int = 4096, name: str | None = None, weight_dtype: torch.dtype | None = None) -> "Llama":
        """Load an HF Llama dir computing in compute_dtype(dtype, device); matmul weights in weight_dtype."""
        cfg = LlamaConfig.from_dir(path)
        return cls(cfg, load_safetensors(path), dtype=compute_dtype(dtype, device), device=device,
                   max_seq=max_seq, name=name or Path(path).name, weight_dtype=weight_dtype)

    @property
    def num_params(self) -> int:
        ts = [self.embed, self.lm_head] if self.lm_head is not self.embed else [self.embed]
        ts += [] if self.norm is None else [self.norm]
        for lw in self.layers:
            ts += [t for t in (lw.attn_norm, lw.mlp_norm) if t is not None]
            ts += [t for lin in (lw.qkv, lw.o, lw.gate_up, lw.down) for t in (lin.w, lin.b) if t is not None]
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
        return self.head(hs), h

    def hidden(self, x: torch.Tensor, cache, positions, start: list[int], mask, *, row0: int = 0,
               layers: list[LayerWeights] | None = None) -> torch.Tensor:
        """The decoder stack (no final norm) over `x` [B, T, hidden]."""
        B, T = positions.shape
        S = mask.shape[-1] if mask is not None else start[0] + T
        cos, sin = F.embedding(positions, self.rope).unsqueeze(2).chunk(2, dim=-1)
        write = _writer(start, T, B, row0, self.device)
        for i, lw in enumerate(layers if layers is not None else self.layers):
            x = self.block(x, lw, cache.k[i], cache.v[i], cos, sin, write, mask, B, T, S, row0)
        return x

    def block(self, x, w: LayerWeights, kc, vc, cos, sin, write, mask, B, T, S, row0):
        c = self.cfg
        nh, nkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        h = x if w.attn_norm is None else F.rms_norm(x, (c.hidden_size,), w.attn_norm, c.rms_norm_eps)
        qkv = w.qkv(h).view(B, T, nh + 2 * nkv, D)
        qk = apply_rope(qkv[:, :, : nh + nkv], cos, sin)
        write(kc, qk[:, :, nh:])
        write(vc, qkv[:, :, nh + nkv:])
        o = F.scaled_dot_product_attention(
            qk[:, :, :nh].transpose(1, 2), kc[row0:row0 + B, :, :S], vc[row0:row0 + B, :, :S],
            attn_mask=mask, enable_gqa=nh != nkv)
        x = x + w.o(o.transpose(1, 2).reshape(B, T, nh * D))
        h = F.rms_norm(x, (c.hidden_size,), w.mlp_norm, c.rms_norm_eps)
        gate, up = w.gate_up(h).chunk(2, dim=-1)
        return x + w.down(F.silu(gate) * up)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h)


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
