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
float32, bfloat16 and int8 layers (runtime/quant.py) run passes of up to EXACT_MAX_ROWS rows through one fused
kernel call each instead (`_fused_hidden`, runtime/fused.py), where it builds: row-exact by construction (its
oneDNN matmuls in row blocks, runtime/linear.py).

dtype: the *compute* dtype is float32 on CPU whatever `spec.model.dtype` says (fp32 is what the logits tests
check); the matmul weights are bfloat16 where the CPU has native bf16 and the spec serves a 16-bit dtype
(`target_weight_dtype`, measured reasons there), else float32; on CUDA everything is the serving dtype.

Memory: `from_dir` reads the checkpoint tensor by tensor (artifacts.weights.open_weights), each straight into
the dtype it is kept in (no float32 detour for bf16 weights), so at most one layer's tensors are in flight;
a quantized model quantizes each linear as it loads; a linear prepacked for oneDNN for every row count drops
its plain weight (Linear's `release`); a 16-bit embedding stays 16-bit (its rows widen exactly at lookup) and
a tied head shares it; an untied head keeps only what it multiplies (its source tensor is dropped, and read
again from the checkpoint by `head_weight` for a drafter that needs it). A bf16 model with a tied head then
holds about its bf16 bytes plus the head's packed copy; an untied one about its bf16 bytes (see
docs/measurements.md; bench/bench_memory.py measures it stage by stage).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from trtspec.artifacts.hf import ModelConfig
from trtspec.artifacts.weights import open_weights
from trtspec.errors import ModelError
from trtspec.runtime.architectures import architecture
from trtspec.runtime.attention import (
    EXACT_MAX_ROWS,
    _attend_one,
    _writer,
    apply_rope,
    exact_keys,
    layer_masks,
    rope_tables,
)
from trtspec.runtime.dtypes import (
    compute_dtype,
    draft_dtype as draft_dtype,  # re-exported: the drafters' import
    storage_dtype,
    target_weight_dtype,
)
from trtspec.runtime.layer import LayerWeights, layer_from_hf
from trtspec.runtime.linear import ONEDNN_SINGLE_ROW_BYTES, Linear

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


@dataclasses.dataclass(frozen=True)
class PassInputs:
    """What every layer of one forward pass shares: RoPE of the new tokens (cos, sin [B, T, 1, D]), the writer
    of their K/V into a cache layer, the pass's shape (B rows of T new tokens over S cache slots) and its first
    cache row."""
    cos: torch.Tensor  # [B, T, 1, D]
    sin: torch.Tensor  # [B, T, 1, D]
    write: Callable[[torch.Tensor, torch.Tensor], None]
    B: int
    T: int
    S: int
    row0: int


class Llama:
    """Weights + a forward over the static KV cache. Not an nn.Module: plain tensors, no hooks, no grads."""

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, torch.Tensor], *,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", max_seq: int = 4096,
                 name: str = "model", prefix: str = "model.", input_norm: bool = True, final_norm: bool = True,
                 embed: torch.Tensor | None = None, lm_head: torch.Tensor | None = None,
                 weight_dtype: torch.dtype | None = None, quantization: str | None = None, release: bool = False):
        """`prefix`, `input_norm`, `final_norm`, `embed`, `lm_head` let a draft head (EAGLE: one layer without
        input norm or final norm, reusing the target's embeddings and LM head) use the same code.
        weight_dtype: dtype of the matmul weights if not `dtype` (bf16 drafters, see draft_dtype).
        quantization: the linears' weight-only quantization (runtime/quant.py), done layer by layer as they
        load (no float copy of the whole model first). release: each linear drops its plain weight once it is
        prepacked for every row count (Linear; such a model cannot be quantized afterwards).
        `weights` may read its tensors lazily (artifacts.weights.LazyWeights): each is read, cast to where it
        goes and dropped, so the checkpoint is never held twice. The embedding (and an untied head's source)
        keeps its stored 16-bit dtype when computing in float32 (dtypes.storage_dtype), its rows cast at lookup."""
        check_supported(cfg)
        self.cfg, self.dtype, self.device, self.name = cfg, dtype, torch.device(device), name
        self.quantization = quantization

        def get(key: str, dt: torch.dtype | None = dtype) -> torch.Tensor:
            if key not in weights:
                raise ModelError(f"{name}: checkpoint is missing tensor {key!r}")
            t = weights[key]
            return t.to(device=device, dtype=dt or storage_dtype(t.dtype, dtype))

        self.embed = embed if embed is not None else get(prefix + "embed_tokens.weight", None)
        if tuple(self.embed.shape) != (cfg.vocab_size, cfg.hidden_size):
            raise ModelError(f"{name}: embed_tokens shape {tuple(self.embed.shape)} does not match the config "
                             f"(vocab {cfg.vocab_size}, hidden {cfg.hidden_size})")
        quantize = None
        if quantization:
            from trtspec.runtime.quant import quantize_linear

            def quantize(lin: Linear):
                return quantize_linear(lin, quantization)
        # oneDNN for one row too on a large model, decided before the layers load (the config's count is a lower
        # bound of num_params: a model whose linears release here is one that use_onednn_single_row turns on)
        big = cfg.num_params * (weight_dtype or dtype).itemsize > ONEDNN_SINGLE_ROW_BYTES
        windows = architecture(cfg).windows(cfg)
        # the head first: an untied head's source is dropped before the layers load, so it never adds to the peak
        if lm_head is not None:
            self.lm_head = lm_head
        elif "lm_head.weight" in weights:
            self.lm_head = get("lm_head.weight", None)
        elif cfg.tie_word_embeddings:
            self.lm_head = self.embed  # tied: one tensor (the head's matmul copy shares it when the dtypes agree)
        else:
            raise ModelError(f"{name}: no lm_head.weight and tie_word_embeddings is false")
        head = Linear(self.lm_head, single_row=big, dtype=weight_dtype or dtype, pack=quantize is None,
                      release=release)
        self.head = head if quantize is None else quantize(head)
        self.source: Path | None = None  # the checkpoint dir (from_dir), where head_weight() reads lm_head again
        if release and lm_head is None and self.lm_head is not self.embed:
            # the head keeps what it multiplies (prepacked, int8, or the weight itself): an untied head's source
            # would be a second copy (Qwen2.5-1.5B: 0.43 GB in bf16), so it stays a meta tensor (shape, dtype)
            self.lm_head = self.lm_head.to("meta")
        self.layers = [layer_from_hf(weights, f"{prefix}layers.{i}.", cfg, dtype, device, input_norm=input_norm,
                                     weight_dtype=weight_dtype, window=windows[i], single_row=big,
                                     quantize=quantize, release=release) for i in range(cfg.num_layers)]
        self.norm = get(prefix + "norm.weight") if final_norm else None
        # EAGLE-3 features: when set (by its proposer), `forward`'s hidden output is the concatenation of these
        # layers' outputs (the residual stream after layer i, un-normed) instead of the final post-norm state
        self.capture_layers: tuple[int, ...] = ()
        # row-exact attention (see `exact_keys`): each query row of a verify pass or of a batched decode attends
        # as a one-row decode step would, so its numbers do not depend on the rows beside it. Off for float
        # targets (their batched attention differs from one row's by ~1e-7, logits by ~5e-5: near-ties only);
        # on for a quantized target (runtime/quant.py): on torch's int8 kernel its bf16 activations round such
        # differences up to ~0.4 in the logits: then speculation would change greedy outputs
        self.exact_attention = False
        bytes_per = (weight_dtype or dtype).itemsize
        if self.num_params * bytes_per > ONEDNN_SINGLE_ROW_BYTES:
            self.use_onednn_single_row(True)
        self.set_max_seq(max_seq)
        self.prepare_fused()

    def head_weight(self) -> torch.Tensor:
        """The LM head's weight [V, H] as stored (a drafter that builds its own head from it: EAGLE-1), read
        again from the checkpoint when loading dropped it (see __init__)."""
        if not self.lm_head.is_meta:
            return self.lm_head
        if self.source is None:
            raise ModelError(f"{self.name}: its LM head weight was released and it has no checkpoint to read it from")
        w = open_weights(self.source)["lm_head.weight"]
        return w.to(device=self.device, dtype=storage_dtype(w.dtype, self.dtype))

    def make_row_exact(self) -> None:
        """Row-exact forward passes: attention row by row (`exact_attention`) and one kernel for any number of
        rows (oneDNN also for one row), so a row's logits are the same bits whatever runs beside it."""
        self.exact_attention = True
        self.use_onednn_single_row(True)

    def use_onednn_single_row(self, on: bool) -> None:
        for lin in [self.head] + [x for lw in self.layers for x in (lw.qkv, lw.o, lw.gate_up, lw.down)]:
            if isinstance(lin, Linear):  # (a quantized twin has one kernel for every row count)
                lin.min_rows = 1 if on or lin.w.dtype == torch.bfloat16 or lin.released else 2

    def set_max_seq(self, max_seq: int) -> None:
        """Size the RoPE tables for positions < max_seq (the cache's slot count)."""
        self.max_seq = max_seq
        cos, sin = rope_tables(self.cfg, max_seq)
        self.rope = torch.cat([cos, sin], -1).to(device=self.device, dtype=self.dtype)  # [max_seq, 2D]: one gather

    @classmethod
    def from_dir(cls, path: str | Path, *, dtype: str | torch.dtype = "float32", device: str = "cpu",
                 max_seq: int = 4096, name: str | None = None, weight_dtype: torch.dtype | None = None,
                 quantization: str | None = None) -> "Llama":
        """Load an HF checkpoint dir computing in compute_dtype(dtype, device); matmul weights in weight_dtype
        (default: target_weight_dtype, by the CPU's capability), quantized as they load with `quantization`;
        tensor by tensor from the files, each linear's plain weight released once prepacked (see __init__)."""
        cfg = ModelConfig.from_dir(path)
        check_supported(cfg)  # before reading any weights
        model = cls(cfg, open_weights(path), dtype=compute_dtype(dtype, device), device=device,
                    max_seq=max_seq, name=name or Path(path).name,
                    weight_dtype=weight_dtype or target_weight_dtype(dtype, device), quantization=quantization,
                    release=True)
        model.source = Path(path)
        return model

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
        x = self.embed_tokens(tokens) if embeds is None else embeds
        captured: dict[int, torch.Tensor] | None = {} if self.capture_layers else None
        h = self.hidden(x, cache, positions, start, mask, row0=row0, capture=captured)
        if self.norm is not None:
            h = F.rms_norm(h, (self.cfg.hidden_size,), self.norm, self.cfg.rms_norm_eps)
        feats = h if captured is None else torch.cat([captured[i] for i in self.capture_layers], -1)
        if not logits:
            return None, feats
        hs = h if logits_at is None else h.gather(1, logits_at[..., None].expand(-1, -1, h.shape[-1]))
        # a pass of short rows (decode, verify, a batch of them): the head row-exact whatever the batch
        return self.head(hs, exact=positions.shape[1] <= EXACT_MAX_ROWS), feats

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
        inputs = PassInputs(cos, sin, _writer(start, T, B, row0, self.device), B, T, S, row0)
        masks = layer_masks(layers, mask, positions, start, S)
        exact = self.exact_attention and mask is not None and T <= EXACT_MAX_ROWS  # (not a long prefill)
        keys: dict[int | None, list | None] = {}
        for i, lw in enumerate(layers):
            if lw.window not in keys:
                keys[lw.window] = exact_keys(masks[lw.window]) if exact else None
            x = self.block(x, lw, cache.k[i], cache.v[i], inputs, masks[lw.window], keys[lw.window])
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
        CPU in float32, every layer with an input norm and its four linears either int8 (trtspec's kernel) or
        bfloat16 or float32 prepacked for oneDNN, and the kernel builds here. Called at load and again whenever the
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

    def block(self, x: torch.Tensor, w: LayerWeights, kc: torch.Tensor, vc: torch.Tensor, p: PassInputs,
              mask: torch.Tensor | None, keys: list | None = None) -> torch.Tensor:
        """One decoder layer over x [B, T, hidden]: its K/V into cache layers kc, vc; mask [B, 1, T, S]."""
        c = self.cfg
        cos, sin, write, B, T, S, row0 = p.cos, p.sin, p.write, p.B, p.T, p.S, p.row0
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

    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """[B, T] token ids -> [B, T, hidden] in the compute dtype (the table may be stored narrower)."""
        return F.embedding(tokens, self.embed).to(self.dtype)
