"""Attention's parts around the decoder: RoPE tables, the masks of sliding windows, the row-exact key lists of
a verify pass, and the writer of new K/V into the static cache."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from trtspec.artifacts.hf import ModelConfig, rope_inv_freq

if TYPE_CHECKING:
    from trtspec.runtime.layer import LayerWeights

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
