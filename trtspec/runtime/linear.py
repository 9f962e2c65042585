"""The runtime's matmul: `Linear`, a weight (and bias) kept prepacked for oneDNN on CPU, called in row blocks of
a fixed size so that a row's result never depends on how many rows share the call (row-exact).

Why blocks: oneDNN picks its kernel, its blocking and so its summation order by the number of rows M. Measured
with torch 2.13 on a Xeon with AMX (2 threads): bf16 weights give other bits for M = 1 than for M = 8 at K = 8960
(Qwen2.5-1.5B's down projection) and for M > 32 than for M <= 32 at every width tried (576..8960); float32
weights give other bits for M = 1 than for M >= 2 from K = 1536 on (SmolLM2's down projection). A greedy verify
pass of k rows then differs from k one-row decode steps, and speculation changes the text. So every call of up
to EXACT_MAX_ROWS rows (or of a batch of such passes) runs as calls of lo..hi rows (fewer rows zero-padded to lo,
more split into calls of hi): each row sees one kernel whatever the pass. `row_blocks` finds (lo, hi) per weight
shape by a probe at load (random rows, each compared bit for bit alone and among others), falling back to fixed
blocks and then to one call per row. For a weight of at least TIMED_MIN_BYTES, the blocks whose call of lo rows
(what a one-row decode step costs) is within FAST_WITHIN of the fastest go first, the least padding first among
them, then the others by cost; each call timed cold (the caches flushed before it, as a decode step finds a
weight it streams from memory). Padding usually costs little on a memory-bound step (a call of 2 rows streams the
weight once, as 1 does), and is sometimes the fast path: on an AMD EPYC (Zen 4, AVX-512 BF16, no AMX), oneDNN's
bf16 kernel for 1 or 2 rows streams Qwen2.5-1.5B's weights at ~24 GB/s and its 4-row kernel at ~31
(docs/measurements.md has the costs by row count). Exact blocks give the same bits whichever is picked (each
equals the rows of every call it covers), so a pick that timing noise flips changes the speed, never an output.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from trtspec.runtime.attention import EXACT_MAX_ROWS

ONEDNN_SINGLE_ROW_BYTES = 16 << 20  # models larger than this (half a typical L3) use oneDNN for one row too
# (lo, hi) rows per oneDNN call, tried in this order: the least padding first, per weight shape (a one-row float32
# step padded to 8 rows cost ~1.15-1.2x the unpadded one, padded to 2 where needed +3-5 %, on SmolLM2 and
# Qwen2.5-1.5B; docs/measurements.md), so a shape whose one-row kernel agrees with its multi-row one is not padded
ROW_BLOCKS = ((1, 32), (2, 32), (4, 32), (8, 32), (8, 16), (8, 8), (1, 1))
FAST_WITHIN = 1.03  # blocks whose lo-row call is within this factor of the fastest are tried first
TIMED_MIN_BYTES = 1 << 20  # smaller weights (cache-resident) keep ROW_BLOCKS' order, untimed
FLUSH_BYTES = 128 << 20  # read before each timed call: more than the last-level caches of this project's CPUs


class Linear:
    """y = x W^T + b. On CPU the weight is also kept prepacked for oneDNN, which multiplies several rows (a
    verify pass, a prefill) 2-7x faster than MKL's GEMM on this project's CPUs. For one row (a decode step)
    oneDNN wins on weights streamed from memory (a large model: ~1.7x), MKL on small, cache-resident ones:
    `single_row` picks oneDNN for one row too (Llama decides by model size). A weight stored in another dtype
    than the input (bf16 drafter weights) is multiplied in that dtype: input cast in, output cast back.

    `pack=False`: no prepacked copy (a weight about to be quantized). `release`: once prepacked for every row
    count (min_rows 1), the plain weight is never multiplied again, so it is released (`w` becomes a meta
    tensor: its shape and dtype without the bytes) rather than held beside its packed twin."""

    __slots__ = ("w", "b", "packed", "min_rows", "rows")

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None, single_row: bool = False,
                 dtype: torch.dtype | None = None, *, pack: bool = True, release: bool = False):
        if dtype is not None:
            w, b = w.to(dtype), (None if b is None else b.to(dtype))
        self.w, self.b = w, b
        self.packed = _onednn_pack(w) if pack else None
        self.min_rows = 1 if single_row or w.dtype == torch.bfloat16 else 2
        # (lo, hi): rows per oneDNN call (module docstring)
        self.rows = None if self.packed is None else row_blocks(self.packed, tuple(w.shape), w.dtype)
        if release and self.packed is not None and self.min_rows == 1:
            self.w = w.to("meta")

    @property
    def released(self) -> bool:
        return self.w.device.type == "meta"

    def __call__(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """x [..., K] -> [..., N]; in row blocks when it has at most EXACT_MAX_ROWS rows or `exact` says so (a
        pass of a batch of rows, each of at most EXACT_MAX_ROWS tokens)."""
        dt = x.dtype
        if dt != self.w.dtype:
            return self(x.to(self.w.dtype), exact).to(dt)
        if self.packed is not None and x.numel() >= self.min_rows * x.shape[-1]:
            if exact or x.numel() <= EXACT_MAX_ROWS * x.shape[-1]:
                return blocked(x, self.packed, self.b, self.rows)
            return _onednn(x, self.packed, self.b)
        return F.linear(x, self.w, self.b)


def _onednn(x: torch.Tensor, packed, b: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")


def blocked(x: torch.Tensor, packed, b: torch.Tensor | None, rows: tuple[int, int]) -> torch.Tensor:
    """x [..., K] times the prepacked weight in calls of lo..hi rows: fewer rows zero-padded to lo, more split."""
    lo, hi = rows
    x2 = x.reshape(-1, x.shape[-1])  # [R, K]
    R = x2.shape[0]
    if lo <= R <= hi:
        return _onednn(x2, packed, b).view(*x.shape[:-1], -1)
    outs = []
    for r in range(0, R, hi):
        part = x2[r:r + hi]  # [n, K]
        n = part.shape[0]
        if n < lo:
            part = torch.cat([part, part.new_zeros(lo - n, part.shape[1])])
        outs.append(_onednn(part, packed, b)[:n])
    return (outs[0] if len(outs) == 1 else torch.cat(outs)).view(*x.shape[:-1], -1)


_FOUND: dict[tuple, tuple[int, int]] = {}


def row_blocks(packed, shape: tuple[int, int], dtype: torch.dtype) -> tuple[int, int]:
    """The first (lo, hi) of ROW_BLOCKS, the fast ones first (module docstring), under which the probe finds
    every row of a call equal, bit for bit, to the same row called alone (padded to lo), for calls of lo + 1, 2,
    3, 4, 5, 8, 9, 16, 17 (those in lo..hi), hi and hi + 1 rows (a split), at every row of each. Every row: a
    kernel may sum only some row positions of its block in another order (measured on an AMD EPYC, Zen 4
    without AMX: at 576 x 1536 the fourth row of a call of 4+ rows, and no other, differs from its one-row
    call). Found once per weight shape, dtype and thread count (what oneDNN's choice of kernel follows) on the
    first weight of that shape; (1, 1), one call per row, is exact by construction."""
    key = (shape, dtype, torch.get_num_threads())
    if key not in _FOUND:
        _FOUND[key] = _probe(packed, shape, dtype)
    return _FOUND[key]


def _probe(packed, shape: tuple[int, int], dtype: torch.dtype) -> tuple[int, int]:
    g = torch.Generator().manual_seed(0)
    for lo, hi in _by_cost(packed, shape, dtype):
        x = torch.randn(hi + 1, shape[1], generator=g).to(dtype)  # [hi + 1, K]
        alone = torch.cat([blocked(x[i:i + 1], packed, None, (lo, hi)) for i in range(hi + 1)])  # [hi + 1, N]
        sizes = sorted({lo + 1, hi, hi + 1} | {m for m in (2, 3, 4, 5, 8, 9, 16, 17) if lo < m <= hi})
        if all(torch.equal(blocked(x[:m], packed, None, (lo, hi)), alone[:m]) for m in sizes):
            return lo, hi
    return ROW_BLOCKS[-1]


def _by_cost(packed, shape: tuple[int, int], dtype: torch.dtype) -> list[tuple[int, int]]:
    """ROW_BLOCKS but (1, 1), the fast ones first (module docstring); in their own order for a small weight."""
    blocks = list(ROW_BLOCKS[:-1])
    if shape[0] * shape[1] * dtype.itemsize < TIMED_MIN_BYTES:
        return blocks
    flush = torch.ones(FLUSH_BYTES // 4)  # [FLUSH_BYTES / 4] float32, written: its pages are real
    cost = {lo: _cold_seconds(packed, shape[1], dtype, lo, flush) for lo in sorted({lo for lo, _ in blocks})}
    fast = min(cost.values()) * FAST_WITHIN
    return sorted(blocks, key=lambda b: max(cost[b[0]], fast))  # stable: the fast ones tie, least padding first


def _cold_seconds(packed, K: int, dtype: torch.dtype, rows: int, flush: torch.Tensor, reps: int = 3) -> float:
    """The least wall time of a oneDNN call of `rows` rows, the caches flushed (`flush` read) before each."""
    x = torch.zeros(rows, K, dtype=dtype)  # [rows, K]
    _onednn(x, packed, None)
    best = float("inf")
    for _ in range(reps):
        flush.sum()
        t = time.perf_counter()
        _onednn(x, packed, None)
        best = min(best, time.perf_counter() - t)
    return best


def _onednn_pack(w: torch.Tensor):
    if (w.device.type != "cpu" or w.dtype not in (torch.float32, torch.bfloat16)
            or not torch.backends.mkldnn.is_available()):
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
