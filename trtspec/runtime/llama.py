"""A compact Llama-family decoder for the torch runtime (gpt-fast style): HF checkpoint in, logits + hidden out.

What it reads: an HF checkpoint directory, its config through `trtspec.artifacts.hf.ModelConfig`
(transformers' AutoConfig) and its weights through `trtspec.artifacts.weights` (`model.safetensors` or sharded
safetensors with `model.safetensors.index.json`). What it runs (`check_supported`): the architectures of
`runtime/architectures.py` — Llama 2/3, Mistral (sliding window), Qwen2/2.5 (q/k/v bias), Qwen3 (q/k RMSNorm)
— with silu, GQA, `head_dim`, tied or untied heads, and full rotary with every RoPE transformers has for
them (`ROPE_TYPES`), whose frequencies transformers' own rope functions compute (`artifacts.hf.rope_inv_freq`).

How it runs: one forward over a batch of rows, each row writing its new tokens' K/V at its own slots of a
pre-allocated static cache (`KVCache`, [layers, batch, kv_heads, max_seq, head_dim]) and attending through an
explicit boolean mask — a causal chain, a padded batch or a draft tree all use the same path. The caller owns
the per-row lengths (see `cache.py`), so rejecting draft tokens is just moving a length pointer back. On CPU,
float32 and int8 layers (runtime/quant.py) run passes of up to EXACT_MAX_ROWS rows through one fused kernel
call each instead (`_fused_hidden`, runtime/fused.py), where it builds: row-exact by construction.

dtype: weights are stored in the checkpoint's dtype and cast to the *compute* dtype at load. On CPU the compute
dtype is float32 whatever `spec.model.dtype` says (fp32 is what the logits tests check); the matmul weights are
bfloat16 where the CPU has native bf16 and the spec serves a 16-bit dtype (`target_weight_dtype`, measured
reasons there), else float32; on CUDA everything is the serving dtype.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from trtspec.artifacts.hf import ModelConfig, rope_inv_freq
from trtspec.artifacts.weights import load_weights
from trtspec.errors import ModelError
from trtspec.runtime.architectures import architecture

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# The runtime's name for the config it runs (one class: the artifacts layer's).
LlamaConfig = ModelConfig
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


def check_supported(cfg: ModelConfig) -> None:
    """The torch runtime's capability check: what this module's forward computes exactly."""
    where = cfg.source
    architecture(cfg)  # one error naming an unsupported architecture and listing the supported ones
    if cfg.hidden_act != "silu":
        raise ModelError(f"{where}: hidden_act {cfg.hidden_act!r} is not supported (only 'silu')")
    if cfg.rope_type not in ROPE_TYPES:
        raise ModelError(f"{where}: rope type {cfg.rope_type!r} is not supported",
                         hint=f"supported: {', '.join(ROPE_TYPES)}")
    if cfg.partial_rotary_factor != 1.0:
        raise ModelError(f"{where}: partial_rotary_factor is not supported")


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


def target_weight_dtype(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype | None:
    """The dtype of the target's matmul weights on CPU when the spec serves a 16-bit dtype: bfloat16 on CPUs
    that multiply it natively (avx512_bf16/AMX, through oneDNN for every row count, so a decode step and a
    verify pass run one kernel and spec and plain decoding stay token-identical), halving the memory traffic
    of a memory-bound decode; None (= the compute dtype, float32) otherwise. Measured on the project's CPUs
    without native bf16 (AVX2, 2 threads, SmolLM2-135M): a bf16 GEMV is slower than fp32 oneDNN; an fp16 GEMV
    is 1.7x faster for one row (LM head 2.8 vs 4.8 ms) but 2-5x slower for the 2..40-row passes (verify,
    prefill: no oneDNN fp16 there) and rounds differently from them, so fp32 serves there.
    `TRTSPEC_TARGET_DTYPE=float32|bfloat16` forces a choice."""
    forced = os.environ.get("TRTSPEC_TARGET_DTYPE")
    if forced:
        return _DTYPES[forced]
    want = _DTYPES[dtype] if isinstance(dtype, str) else dtype
    if torch.device(device).type == "cpu" and want != torch.float32 and cpu_has_fast_bf16():
        return torch.bfloat16
    return None


@functools.lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
        return (" avx512_bf16" in flags or " amx_bf16" in flags) and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (OSError, RuntimeError, AttributeError):
        return False


# ----------------------------------------------------------------------------------------------------- RoPE

def rope_tables(cfg: ModelConfig, max_seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos [max_seq, D] and the sign-folded sin [max_seq, D] so that rope(x) = x*cos + roll(x, D/2)*sin."""
    inv_freq, scale = rope_inv_freq(cfg, max_seq)
    freqs = torch.arange(max_seq, dtype=torch.float)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    half = cfg.head_dim // 2
    sin = emb.sin() * scale
    sin[:, :half] = -sin[:, :half]  # rotate_half(x) = cat(-x2, x1) = roll(x, D/2) * [-1.., +1..]
    return emb.cos() * scale, sin


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
    q_norm: torch.Tensor | None = None  # [head_dim] RMSNorm weights on q and k (Qwen3)
    k_norm: torch.Tensor | None = None
    window: int | None = None  # sliding attention window of this layer (Mistral, Qwen2/3)
    fused: tuple | None = None  # (the fused CPU kernel's op, its weight arguments) when it runs this layer (fused.py)


def layer_from_hf(w: dict[str, torch.Tensor], prefix: str, cfg: ModelConfig, dtype, device, *,
                  input_norm: bool = True, weight_dtype: torch.dtype | None = None,
                  window: int | None = None) -> LayerWeights:
    def get(name: str) -> torch.Tensor:
        key = prefix + name
        if key not in w:
            raise ModelError(f"checkpoint is missing tensor {key!r}")
        return w[key].to(device=device, dtype=dtype)

    arch = architecture(cfg)
    bias = arch.biases(cfg)

    def opt(name: str, has: bool) -> torch.Tensor | None:  # a bias the architecture has must be there
        return get(name) if has else None

    a = "self_attn."
    q, k, v = get(a + "q_proj.weight"), get(a + "k_proj.weight"), get(a + "v_proj.weight")
    want = ((cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, cfg.hidden_size)
    wqkv = torch.cat([q, k, v]).contiguous()
    if tuple(wqkv.shape) != want:
        raise ModelError(f"{prefix}self_attn: q/k/v shapes {tuple(q.shape)}/{tuple(k.shape)}/{tuple(v.shape)} "
                         f"do not match the config (heads {cfg.num_heads}, kv heads {cfg.num_kv_heads}, "
                         f"head_dim {cfg.head_dim}, hidden {cfg.hidden_size})")
    bqkv = torch.cat([get(a + "q_proj.bias"), get(a + "k_proj.bias"), get(a + "v_proj.bias")]) if bias["qkv"] else None
    m = "mlp."
    bgu = torch.cat([get(m + "gate_proj.bias"), get(m + "up_proj.bias")]) if bias["mlp"] else None
    return LayerWeights(
        attn_norm=get("input_layernorm.weight") if input_norm else None,
        qkv=Linear(wqkv, bqkv, dtype=weight_dtype),
        o=Linear(get(a + "o_proj.weight"), opt(a + "o_proj.bias", bias["o"]), dtype=weight_dtype),
        mlp_norm=get("post_attention_layernorm.weight"),
        gate_up=Linear(torch.cat([get(m + "gate_proj.weight"), get(m + "up_proj.weight")]).contiguous(),
                       bgu, dtype=weight_dtype),
        down=Linear(get(m + "down_proj.weight"), opt(m + "down_proj.bias", bias["mlp"]), dtype=weight_dtype),
        q_norm=opt(a + "q_norm.weight", arch.qk_norm), k_norm=opt(a + "k_norm.weight", arch.qk_norm),
        window=window,
    )


class Llama:
    """Weights + a forward over the static KV cache. Not an nn.Module: plain tensors, no hooks, no grads."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", max_seq: int = 4096, name: str = "model",
                 prefix: str = "model.", input_norm: bool = True, final_norm: bool = True,
                 embed: torch.Tensor | None = None, lm_head: torch.Tensor | None = None,
                 weight_dtype: torch.dtype | None = None):
        """`prefix`, `input_norm`, `final_norm`, `embed`, `lm_head` let a draft head (EAGLE: one layer without
        input norm or final norm, reusing the target's embeddings and LM head) use the same code.
        weight_dtype: dtype of the matmul weights if not `dtype` (bf16 drafters, see draft_dtype)."""
        check_supported(cfg)
        self.cfg, self.dtype, self.device, self.name = cfg, dtype, torch.device(device), name

        def get(key: str) -> torch.Tensor:
            if key not in weights:
                raise ModelError(f"{name}: checkpoint is missing tensor {key!r}")
            return weights[key].to(device=device, dtype=dtype)

        self.embed = embed if embed is not None else get(prefix + "embed_tokens.weight")
        if tuple(self.embed.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ModelError(f"{name}: embed_tokens shape {tuple(self.embed.shape)} does not match the config "
                             f"(vocab {cfg.vocab_size}, hidden {cfg.hidden_size})")
        windows = architecture(cfg).windows(cfg)
        self.layers = [layer_from_hf(weights, f"{prefix}layers.{i}.", cfg, dtype, device, input_norm=input_norm,
                                     weight_dtype=weight_dtype, window=windows[i]) for i in range(cfg.num_layers)]
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
        # EAGLE-3 features: when set (by its proposer), `forward`'s hidden output is the concatenation of these
        # layers' outputs (the residual stream after layer i, un-normed) instead of the final post-norm state
        self.capture_layers: tuple[int, ...] = ()
        # row-exact attention (see `exact_keys`): each query row of a verify pass or of a batched decode attends
        # as a one-row decode step would, so its numbers do not depend on the rows beside it. Off for float
        # targets (their batched attention differs from one row's by ~1e-7, logits by ~5e-5: near-ties only);
        # on for a quantized target (runtime/quant.py), whose bf16 activations round such differences up
        # to ~0.4 in the logits: then speculation would change greedy outputs
        self.exact_attention = False
        bytes_per = (weight_dtype or dtype).itemsize
        if self.num_params * bytes_per > ONEDNN_SINGLE_ROW_BYTES:
            self.use_onednn_single_row(True)
        self.set_max_seq(max_seq)
        self.prepare_fused()

    def make_row_exact(self) -> None:
        """Row-exact forward passes: attention row by row (`exact_attention`) and one kernel for any number of
        rows (oneDNN also for one row), so a row's logits are the same bits whatever runs beside it."""
        self.exact_attention = True
        self.use_onednn_single_row(True)

    def use_onednn_single_row(self, on: bool) -> None:
        for lin in [self.head] + [x for lw in self.layers for x in (lw.qkv, lw.o, lw.gate_up, lw.down)]:
            if isinstance(lin, Linear):  # (a quantized twin has one kernel for every row count)
                lin.min_rows = 1 if on or lin.w.dtype == torch.bfloat16 else 2

    def set_max_seq(self, max_seq: int) -> None:
        """Size the RoPE tables for positions < max_seq (the cache's slot count)."""
        self.max_seq = max_seq
        cos, sin = rope_tables(self.cfg, max_seq)
        self.rope = torch.cat([cos, sin], -1).to(device=self.device, dtype=self.dtype)  # [max_seq, 2D]: one gather

    @classmethod
    def from_dir(cls, path: str | Path, *, dtype: str | torch.dtype = "float32", device: str = "cpu",
                 max_seq: int = 4096, name: str | None = None, weight_dtype: torch.dtype | None = None) -> "Llama":
        """Load an HF checkpoint dir computing in compute_dtype(dtype, device); matmul weights in weight_dtype
        (default: target_weight_dtype, by the CPU's capability)."""
        cfg = ModelConfig.from_dir(path)
        check_supported(cfg)  # before reading any weights
        return cls(cfg, load_weights(path), dtype=compute_dtype(dtype, device), device=device,
                   max_seq=max_seq, name=name or Path(path).name,
                   weight_dtype=weight_dtype or target_weight_dtype(dtype, device))

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
        are wanted (default: all). Returns (logits [B, M, V] | None, final (post-norm) hidden [B, T, hidden]),
        or with `capture_layers` the captured layers' outputs side by side [B, T, n * hidden] as the hidden.
        """
        x = F.embedding(tokens, self.embed) if embeds is None else embeds
        captured: dict[int, torch.Tensor] | None = {} if self.capture_layers else None
        h = self.hidden(x, cache, positions, start, mask, row0=row0, capture=captured)
        if self.norm is not None:
            h = F.rms_norm(h, (self.cfg.hidden_size,), self.norm, self.cfg.rms_norm_eps)
        feats = h if captured is None else torch.cat([captured[i] for i in self.capture_layers], -1)
        if not logits:
            return None, feats
        hs = h if logits_at is None else h.gather(1, logits_at[..., None].expand(-1, -1, h.shape[-1]))
        return self.head(hs), feats

    def hidden(self, x: torch.Tensor, cache, positions, start: list[int], mask, *, row0: int = 0,
               layers: list[LayerWeights] | None = None,
               capture: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """The decoder stack (no final norm) over `x` [B, T, hidden]; `capture` gets the outputs of the
        layers in capture_layers."""
        B, T = positions.shape
        layers = layers if layers is not None else self.layers
        if T <= EXACT_MAX_ROWS and x.dtype == torch.float32 and all(lw.fused is not None for lw in layers):
            return self._fused_hidden(x, cache, positions, start, mask, row0, layers, capture)
        S = mask.shape[-1] if mask is not None else start[0] + T
        cos, sin = F.embedding(positions, self.rope).unsqueeze(2).chunk(2, dim=-1)
        write = _writer(start, T, B, row0, self.device)
        masks = layer_masks(layers, mask, positions, start, S)
        exact = self.exact_attention and mask is not None and T <= EXACT_MAX_ROWS  # (not a long prefill)
        keys: dict[int | None, list | None] = {}
        for i, lw in enumerate(layers):
            if lw.window not in keys:
                keys[lw.window] = exact_keys(masks[lw.window]) if exact else None
            x = self.block(x, lw, cache.k[i], cache.v[i], cos, sin, write, masks[lw.window], B, T, S, row0,
                           keys[lw.window])
            if capture is not None and i in self.capture_layers:
                capture[i] = x
        return x

    def _fused_hidden(self, x, cache, positions, start, mask, row0, layers, capture) -> torch.Tensor:
        """`hidden` through the fused CPU kernel, one call per layer (runtime/fused.py): row-exact itself."""
        B, T = positions.shape
        S = mask.shape[-1] if mask is not None else start[0] + T
        c = self.cfg
        h = x.reshape(B * T, c.hidden_size).clone()  # the kernel updates it in place: never the caller's tensor
        pos = positions.contiguous()
        masks = {w: None if m is None else m[:, 0].contiguous()  # ([B, T, S]: the kernel's layout)
                 for w, m in layer_masks(layers, mask, positions, start, S).items()}
        for i, lw in enumerate(layers):
            op, args = lw.fused
            op(h, *args, cache.k[i], cache.v[i], row0, pos, start, self.rope, masks[lw.window],
               c.num_heads, c.num_kv_heads)
            if capture is not None and i in self.capture_layers:
                capture[i] = h.view(B, T, -1).clone()
        return h.view(B, T, -1)

    def prepare_fused(self) -> bool:
        """Run this model's decoder layers through the fused CPU kernel (runtime/fused.py) where it can: on
        CPU in float32, every layer with an input norm and its four linears either int8 (bf16 activations) or
        float32 prepacked for oneDNN, and the kernel builds here. Called at load and again whenever the
        linears are replaced (runtime/quant.py); returns whether the layers run fused."""
        from trtspec.runtime import fused

        for lw in self.layers:
            lw.fused = None
        if not (self.device.type == "cpu" and self.dtype == torch.float32 and self.cfg.head_dim % 2 == 0):
            return False
        plan = [fused.layer_args(lw, self.cfg.rms_norm_eps) for lw in self.layers]
        if not plan or any(p is None for p in plan) or not fused.available():
            return False
        for lw, (name, args) in zip(self.layers, plan):
            lw.fused = (getattr(torch.ops.trtspec, name), args)
        self.use_onednn_single_row(True)  # the head too: one kernel for any number of rows, so logits stay row-exact
        return True

    def block(self, x, w: LayerWeights, kc, vc, cos, sin, write, mask, B, T, S, row0, keys=None):
        c = self.cfg
        nh, nkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        h = x if w.attn_norm is None else F.rms_norm(x, (c.hidden_size,), w.attn_norm, c.rms_norm_eps)
        qkv = w.qkv(h).view(B, T, nh + 2 * nkv, D)
        if w.q_norm is None:
            qk = apply_rope(qkv[:, :, : nh + nkv], cos, sin)
        else:  # Qwen3: RMSNorm over each head's dims on q and k, before RoPE
            qk = apply_rope(torch.cat([F.rms_norm(qkv[:, :, :nh], (D,), w.q_norm, c.rms_norm_eps),
                                       F.rms_norm(qkv[:, :, nh:nh + nkv], (D,), w.k_norm, c.rms_norm_eps)], 2),
                            cos, sin)
        write(kc, qk[:, :, nh:])
        write(vc, qkv[:, :, nh + nkv:])
        q = qk[:, :, :nh].transpose(1, 2)
        if keys is None:
            o = F.scaled_dot_product_attention(q, kc[row0:row0 + B, :, :S], vc[row0:row0 + B, :, :S],
                                               attn_mask=mask, enable_gqa=nh != nkv)
        else:  # row-exact: each query row alone, on exactly the keys it sees, as a one-row decode step
            o = torch.cat([torch.cat([_attend_one(q[b:b + 1, :, t:t + 1], kc, vc, row0 + b, sel, nh != nkv)
                                      for t, sel in enumerate(row)], 2) for b, row in enumerate(keys)], 0)
        x = x + w.o(o.transpose(1, 2).reshape(B, T, nh * D))
        h = F.rms_norm(x, (c.hidden_size,), w.mlp_norm, c.rms_norm_eps)
        gate, up = w.gate_up(h).chunk(2, dim=-1)
        return x + w.down(F.silu(gate) * up)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h)


EXACT_MAX_ROWS = 64  # longer passes (prefills) keep batched attention: they are the same in either decoding


def exact_keys(mask: torch.Tensor) -> list[list[int | torch.Tensor]]:
    """Per row b and query t of `mask` [B, 1, T, S]: the cache slots it sees, as a count n (slots 0..n-1, the
    common case: a chain) or an index tensor (a tree node: the prefix and its ancestors, in slot order)."""
    m = mask[:, 0]
    counts = m.sum(-1)
    prefix = m.cumsum(-1).gather(-1, (counts - 1).clamp_min(0)[..., None])[..., 0] == counts  # the first n all seen
    out: list[list[int | torch.Tensor]] = []
    for b, (cnt, pre) in enumerate(zip(counts.tolist(), prefix.tolist())):
        out.append([n if ok else m[b, t].nonzero()[:, 0] for t, (n, ok) in enumerate(zip(cnt, pre))])
    return out


def _attend_one(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, row: int, sel: int | torch.Tensor,
                gqa: bool) -> torch.Tensor:
    """One query row [1, H, 1, D] on cache row `row`'s slots `sel` (a count: 0..sel-1, else indices): the call a
    one-row decode step makes (no mask, the keys as a prefix of the cache)."""
    if isinstance(sel, int):
        k, v = kc[row:row + 1, :, :sel], vc[row:row + 1, :, :sel]
    else:
        k, v = kc[row:row + 1, :, sel], vc[row:row + 1, :, sel]
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)


def layer_masks(layers: list[LayerWeights], mask: torch.Tensor | None, positions: torch.Tensor, start: list[int],
                S: int) -> dict[int | None, torch.Tensor | None]:
    """The mask of each attention window the layers use (None: no window, `mask` itself), made once."""
    masks: dict[int | None, torch.Tensor | None] = {None: mask}
    for lw in layers:
        if lw.window not in masks:
            masks[lw.window] = window_mask(mask, positions, start, S, lw.window)
    return masks


def window_mask(mask: torch.Tensor | None, positions: torch.Tensor, start: list[int], S: int,
                window: int) -> torch.Tensor | None:
    """`mask` narrowed to a sliding window: a query at position p also needs key position > p - window (as
    transformers' sliding_window_overlay). Committed slot s holds position s; the step's own entries at slots
    start[b].. hold `positions` (a tree's nodes share depths). None (no narrowing) while every position is
    inside the window."""
    if int(positions.max()) < window:
        return mask
    B, T = positions.shape
    kpos = torch.arange(S, device=positions.device).repeat(B, 1)
    for b in range(B):
        kpos[b, start[b]:start[b] + T] = positions[b, : max(0, min(T, S - start[b]))]
    near = kpos[:, None, None, :] > positions[:, None, :, None] - window  # [B, 1, T, S]
    return near if mask is None else mask & near


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
