"""Quantization of a drafter's linears (`speculative.draft_quantization = "int8" | "int4" | "w8a8" | "w4a8"`) and
the target's (`model.quantization = "int8" | "w8a8" | "w4a8"`): weight-only, or with int8 activations too.

Drafts only propose: the target verifies every token, so a quantized drafter changes acceptance, never the
output (greedy: token identity; sampling: the rejection sampler gets the quantized drafter's own q, which its
logits give). A quantized target is another model (its own outputs, not fp32's): what stays true is that
speculative and plain decoding of it give the same tokens: the int8 kernel computes each row on its own (a
row's result does not depend on the rows beside it; tests/operate/test_quant.py checks it), as the fp32
oneDNN path does, and the engine makes a quantized target's passes row-exact (`runtime.torch.row_exact`,
Llama.make_row_exact: attention too), because bf16 activations round batched attention's ~1e-7 differences
into different greedy tokens.

    int8  per output channel, symmetric: W ~ s[n] * q[n, k], q in [-127, 127], float32 scales; multiplied by
          trtspec's own CPU kernel (kernels/int8_mm.h, built with the fused layer: runtime/fused.py), each row of
          activations rounded to int16 by its own scale (32767 levels: far below the weights' own rounding), in
          exact integer sums (`int8_mm_reference` computes the same bits): it reads each weight once for all the
          rows of a pass, and an int16 dot product takes twice the pairs of a float32 one an instruction, so a
          verify pass of 5 rows costs about one decode step; a row's sum is the same whatever the rows beside it,
          a prefill's rows included (the kernel takes every pass). Where
          that kernel is not built (no compiler, TRTSPEC_FUSED=0), torch's `_weight_int8pack_mm` (x @ q^T * s, no
          dequantized copy) in bfloat16 activations where the CPU kernel takes them (see `int8_dtype`; it
          re-reads the weights for every 4 rows), else dequantized once at load (same numbers, no speed-up).
          That kernel needs the input width to be a multiple of KERNEL_K (torch 2.13 segfaults on K = 33):
          others dequantize. A model whose layers are all int8 runs them through the fused CPU kernel
    int4  groups of GROUP input channels, symmetric: q in [-8, 7], one scale per (row, group); multiplied by
          dequantizing to the input's dtype at load (torch's int4 CPU kernels want packed layouts per
          version: the numbers are int4's, the speed is the float kernel's)
    w8a8  int8's weights, packed in tiles (pack_tiles), times each row of activations rounded to int8 by its own
          scale (dynamic, per token: no calibration), in exact int32 sums (kernels/w8a8_mm.h: AVX-512 VNNI or
          AVX2 integer dot products; tiles of 16 weight rows, W4A8's layout a byte a weight): a verify pass of 5
          rows costs 1.1-1.4x a decode step and of 9 rows 1.2-1.45x (Qwen2.5-Coder-1.5B on an AMD EPYC;
          docs/measurements.md). Row-exact by construction (an
          integer sum has no order), and the same bits from every instruction set's kernel, torch's int8 GEMM for
          long passes and the torch path (torch._int_mm) where the kernel is not built. Another model again: its
          greedy text followed the bf16 target's on 3 of 12 Qwen prompts of up to 128 tokens (docs/qwen.md)
    w4a8  4-bit weights in groups of W4_GROUP columns, each group's scale an integer step (<= 255) of its row's
          scale (quantize_w4a8), times W8A8's int8 activations: the sum over groups of step x exact group sum
          stays an integer (int32, the steps bounded by w4a8_steps), so W8A8's guarantees hold (row-exact, the
          same bits from every kernel and the torch path) at 4.5 bits a weight (kernels/w4a8_mm.h: tiles of 16
          weight rows, the lanes of one dot product). Qwen2.5-Coder-1.5B on an AMD EPYC, two runs: a decode step
          1.1-1.6x faster than W8A8's, a verify pass of 5 rows 1.3-1.5x (docs/measurements.md). Round to nearest,
          no calibration: another model again

`quantize_proposer` walks a proposer's attributes: each runtime Llama (its layers' qkv/o/gate_up/down and its
head) and each Linear, alone or in (nested) lists, is replaced by its quantized twin (new objects: a tensor
shared with the target stays the target's).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F

from trtspec.runtime import fused
from trtspec.runtime.llama import LayerWeights, Linear, Llama

GROUP = 32
INT8_ACT_LEVELS = 32767  # kernels/int8_mm.h rounds each row of activations to int16 (LEVELS)
MODES = ("int8", "int4", "w8a8", "w4a8")
TILE_ROWS, TILE_COLS = 16, 64  # W8A8Linear's packed layout: kernels/w8a8_mm.h's NT and CK
W4_TILE, W4_GROUP = 16, 32  # W4A8Linear's packed layout: kernels/w4a8_mm.h's NT and G
W4_DOT_MAX = W4_GROUP * 8 * 127  # the largest |sum| of one group's products (|q| <= 8, |xq| <= 127)
KERNEL_K = 8  # _weight_int8pack_mm's input width must be a multiple of this (a crash, not an error, otherwise)


CHUNK_BYTES = 32 << 20  # float32 temporaries of one block of rows while quantizing
LONG_PASS_ROWS = 2048  # weight rows at a time in W8A8Linear's long passes and the W4A8 reference
LONG_PASS_ROWS_W8A8 = 64  # W8A8Linear: passes of more rows (a long prefill) take torch's int8 GEMM


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scales float32 [N]) with w ~ q * scales[:, None]. Row blocks of CHUNK_BYTES at a time (each
    row on its own, so the same numbers): a 151936-row LM head would otherwise make ~4 float32 copies of itself."""
    N, K = w.shape
    q = torch.empty(N, K, dtype=torch.int8, device=w.device)
    s = torch.empty(N, dtype=torch.float32, device=w.device)
    step = max(1, CHUNK_BYTES // (4 * max(K, 1)))
    for i in range(0, N, step):
        wi = w[i:i + step].float()  # [rows, K]
        si = (wi.abs().amax(1) / 127.0).clamp_min(1e-12)
        q[i:i + step] = torch.round(wi / si[:, None]).clamp(-127, 127).to(torch.int8)
        s[i:i + step] = si
    return q, s


def quantize_int4(w: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """w with each row's groups of `group` columns rounded to 4-bit symmetric levels (dequantized, float32)."""
    w = w.float()
    N, K = w.shape
    pad = (-K) % group
    g = F.pad(w, (0, pad)).view(N, -1, group)
    s = (g.abs().amax(-1, keepdim=True) / 7.0).clamp_min(1e-12)
    return (torch.round(g / s).clamp(-8, 7) * s).view(N, -1)[:, :K].contiguous()


@functools.lru_cache(maxsize=4)
def int8_kernel(dtype: torch.dtype) -> bool:
    """torch's weight-only int8 CPU matmul runs for inputs of `dtype` and matches the dequantized product."""
    try:
        q, s = quantize_int8(torch.randn(16, 64))
        x = torch.randn(3, 64, dtype=dtype)
        y = torch.ops.aten._weight_int8pack_mm(x, q, s.to(dtype))
        ref = F.linear(x.float(), q.float() * s[:, None])
        return bool(torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-2))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def int8_dtype(weight_dtype: torch.dtype) -> torch.dtype | None:
    """The activation dtype Int8Linear multiplies in: bfloat16 where the kernel takes it (the kernel's fast,
    vectorized path; its fp32-input path is ~10x slower on torch 2.13), else the weight's dtype if the kernel
    takes that, else None (dequantize instead)."""
    for dt in (torch.bfloat16, weight_dtype):
        if dt in (torch.float32, torch.bfloat16) and int8_kernel(dt):
            return dt
    return None


class Int8Linear:
    """y = x (q s)^T + b through trtspec's int8 kernel (`own`: activations rounded to int16 per row) or torch's
    _weight_int8pack_mm (activations of `dtype`; see the module docstring)."""

    __slots__ = ("q", "s", "b", "n", "min_rows", "own")

    def __init__(self, lin: Linear, dtype: torch.dtype, own: bool = False):
        self.min_rows = lin.min_rows  # (Llama.use_onednn_single_row sets it; unused here)
        self.own = own
        self.q, s = quantize_int8(lin.w)
        self.s = s.to(dtype)
        self.b = None if lin.b is None else lin.b.to(dtype)
        self.n = self.q.shape[0]

    @property
    def w(self) -> torch.Tensor:
        """The stored weight (int8): what Llama.num_params counts."""
        return self.q

    def __call__(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """x [..., K] -> [..., N]; row-exact at every row count, a long prefill's included: trtspec's kernel takes
        every pass (`exact` changes nothing here). Its integer dot products made a GEMM of widened weight blocks no
        faster for long passes: Qwen2.5-Coder-1.5B-sized matmuls on an AMD EPYC, 74 / 256 / 512 rows, the kernel
        250 / 884 / 1857 ms against 288 / 873 / 1806 for oneDNN's bf16 GEMM (widening each block of weights
        first); the AVX2 build 376 / 1215 against 841 / 1789 for float32's."""
        dt = x.dtype
        if dt != self.s.dtype:
            return self(x.to(self.s.dtype), exact).to(dt)
        x2 = x.reshape(-1, x.shape[-1]).contiguous()  # [R, K]
        if self.own:
            y = torch.ops.trtspec.int8_mm(x2, self.q, self.s)
        else:
            y = torch.ops.aten._weight_int8pack_mm(x2, self.q, self.s)
        y = y.view(*x.shape[:-1], self.n)
        return y if self.b is None else y + self.b


def pack_tiles(q: torch.Tensor) -> torch.Tensor:
    """q [N, K] int8 -> [Np, Kp] (N, K zero-padded to multiples of TILE_ROWS, TILE_COLS), laid out as
    kernels/w8a8_mm.h reads it: [Np / TILE_ROWS, Kp / 4, TILE_ROWS, 4], each tile one run whose 64-byte vectors
    hold 4 columns of its TILE_ROWS rows."""
    N, K = q.shape
    qp = F.pad(q, (0, (-K) % TILE_COLS, 0, (-N) % TILE_ROWS))  # [Np, Kp]
    Np, Kp = qp.shape
    tiles = qp.view(Np // TILE_ROWS, TILE_ROWS, Kp // 4, 4).transpose(1, 2)  # [T, Kp / 4, TILE_ROWS, 4]
    return tiles.contiguous().view(Np, Kp)


def unpack_tiles(qp: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """pack_tiles' inverse: q [n, k]."""
    Np, Kp = qp.shape
    q = qp.view(Np // TILE_ROWS, Kp // 4, TILE_ROWS, 4).transpose(1, 2).reshape(Np, Kp)
    return q[:n, :k].contiguous()


def quantize_rows(x: torch.Tensor, levels: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """x [R, K] -> (xq [R, K], sx float32 [R]): each row rounded (half to even) to `levels` levels of its largest
    magnitude, as kernels/scaled_rows.h's `round_row` does it, op for op (true divisions, not a reciprocal's
    product); int8 for W8A8's 127 levels, int16 for the int8 kernel's 32767. A row with a NaN or an infinity gets
    the scale NaN (its products NaN, as a float product's); its integers are then zeros."""
    xf = x.float()  # [R, K]
    finite = torch.isfinite(xf).all(1)  # [R]
    xf = torch.where(finite[:, None], xf, torch.zeros_like(xf))
    amax = xf.abs().amax(1)  # [R]
    lv = torch.full_like(amax, float(levels))
    inv = torch.where(amax > 0, lv / amax, torch.zeros_like(amax))  # [R]
    dtype = torch.int8 if levels <= 127 else torch.int16
    xq = torch.round(xf * inv[:, None]).clamp(-levels, levels).to(dtype)  # [R, K]
    return xq, torch.where(finite, amax / lv, torch.full_like(amax, float("nan")))


def int8_mm_reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x [R, K] float -> [R, N] float32 = kernels/int8_mm.h's bits: each row rounded to int16 (INT8_ACT_LEVELS),
    its exact integer sums with q [N, K] int8 (float64 products and sums: every partial sum is an integer below
    2^53, so exact), then float(sum) * sx[r] * s[n]."""
    xq, sx = quantize_rows(x, INT8_ACT_LEVELS)
    return _scaled(xq.double() @ q.double().t(), sx, s)  # (the sums [R, N] exact)


def w8a8_mm_reference(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """x [R, K] float -> [R, N] float32 = w8a8_mm's bits: int32 sums by torch._int_mm (exact, as the kernel's),
    then float(sum) * sx[r] * s[n]. The torch path where the kernel is not built, and long passes' GEMM."""
    xq, sx = quantize_rows(x)
    return _scaled_int_mm(xq, sx, q, s)


def _scaled_int_mm(xq: torch.Tensor, sx: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """xq [R, K] int8 (row scales sx [R]) times q [N, K] int8 (scales s [N]) -> [R, N] float32: the int32 sums of
    torch._int_mm, scaled."""
    return _scaled(torch._int_mm(xq, q.t()), sx, s)


def _scaled(sums: torch.Tensor, sx: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Integer sums [R, N] (any dtype that holds them exactly) -> float(sum) * sx[r] * s[n], float32: the kernels'
    order of products (kernels/scaled_rows.h's put_scaled), which the references must keep for the same bits."""
    return sums.float() * sx[:, None] * s.float()


class W8A8Linear:
    """y = x (q s)^T + b with int8 activations: q int8 per output channel (as Int8Linear's), each row of x rounded
    to int8 by its own scale (dynamic, per token), int32 sums (kernels/w8a8_mm.h, `own`: packed by pack_tiles;
    else q [N, K] and w8a8_mm_reference). Another model than the weight-only int8 one, its rows exact whatever
    the rows beside them, and the same bits from the kernel of any instruction set and from the torch path."""

    __slots__ = ("q", "s", "b", "n", "k", "min_rows", "own")

    def __init__(self, lin: Linear, own: bool):
        self.min_rows = lin.min_rows  # (Llama.use_onednn_single_row sets it; unused here)
        self.own = own
        q, self.s = quantize_int8(lin.w)  # [N, K], [N] float32
        self.n, self.k = q.shape
        self.q = pack_tiles(q) if own else q
        self.b = None if lin.b is None else lin.b.float()

    @property
    def w(self) -> torch.Tensor:
        """The stored weight (int8; packed, so a few padding rows and columns more): what num_params counts."""
        return self.q

    def __call__(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """x [..., K] -> [..., N] in x's dtype; row-exact at every row count (integer sums: no order to keep).
        Passes of more than LONG_PASS_ROWS_W8A8 rows (a long prefill) take torch._int_mm on unpacked blocks of weight
        rows: the same bits, from a GEMM."""
        x2 = x.reshape(-1, self.k).float()  # [R, K]
        if not self.own:
            y = w8a8_mm_reference(x2, self.q, self.s)
        elif x2.shape[0] <= LONG_PASS_ROWS_W8A8:
            y = torch.ops.trtspec.w8a8_mm(x2, self.q, self.s)
        else:
            y = self._long_pass(x2)
        y = y if self.b is None else y + self.b  # [R, N] float32
        return y.to(x.dtype).view(*x.shape[:-1], self.n)

    def _long_pass(self, x: torch.Tensor) -> torch.Tensor:
        """x [R, K] float32 -> [R, N] float32, w8a8_mm's bits, by torch's int8 GEMM on LONG_PASS_ROWS weight rows
        unpacked at a time."""
        xq, sx = quantize_rows(x)  # [R, K], [R]
        y = torch.empty(x.shape[0], self.n, dtype=torch.float32)  # [R, N]
        for n0 in range(0, self.n, LONG_PASS_ROWS):
            n1 = min(self.n, n0 + LONG_PASS_ROWS)
            q = unpack_tiles(self.q[n0:n0 + LONG_PASS_ROWS], n1 - n0, self.k)  # [n, K]
            y[:, n0:n1] = _scaled_int_mm(xq, sx, q, self.s[n0:n1])
        return y


def w4a8_steps(ng: int) -> int:
    """The largest integer step m of a group's scale for a weight of ng groups: m * W4_DOT_MAX * ng < 2^31, so no
    sum of the kernel's can leave int32 (255 at most: one byte)."""
    return max(1, min(255, (2**31 - 1) // (W4_DOT_MAX * ng)))


def quantize_w4a8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q int8 [N, Kp] in [-8, 7], m uint8 [N, ng], S float32 [N]), Kp = ng * W4_GROUP (zero-padded):
    w[n, k] ~ q[n, k] * S[n] * m[n, k // W4_GROUP]. Each group's ideal scale (its largest magnitude / 7) rounded to
    an integer step m of the row's scale S = the largest ideal scale / w4a8_steps(ng) (a group that is not all
    zeros gets at least one step). Row blocks of CHUNK_BYTES at a time."""
    N, K = w.shape
    ng = -(-K // W4_GROUP)
    steps = w4a8_steps(ng)
    q = torch.empty(N, ng * W4_GROUP, dtype=torch.int8)
    m = torch.empty(N, ng, dtype=torch.uint8)
    S = torch.empty(N, dtype=torch.float32)
    rows = max(1, CHUNK_BYTES // (4 * ng * W4_GROUP))
    for i in range(0, N, rows):
        g = F.pad(w[i:i + rows].float(), (0, ng * W4_GROUP - K)).view(-1, ng, W4_GROUP)  # [n, ng, G]
        ideal = g.abs().amax(-1) / 7.0  # [n, ng]
        Si = ideal.amax(1) / steps  # [n]
        mi = torch.where(ideal > 0, torch.round(ideal / Si.clamp_min(1e-30)[:, None]).clamp(1, steps),
                         torch.zeros_like(ideal))  # [n, ng]
        step = (Si[:, None] * mi)[..., None]  # [n, ng, 1]
        qi = torch.where(step > 0, torch.round(g / step.clamp_min(1e-30)), torch.zeros_like(g)).clamp(-8, 7)
        q[i:i + rows] = qi.view(-1, ng * W4_GROUP).to(torch.int8)
        m[i:i + rows] = mi.to(torch.uint8)
        S[i:i + rows] = Si
    return q, m, S


def pack_w4a8(q: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """(q int8 [N, Kp], m uint8 [N, ng]) -> uint8 [ceil(N / W4_TILE), tile bytes], as kernels/w4a8_mm.h reads it:
    per tile of W4_TILE rows, m [ng, W4_TILE] (padded to 64 bytes), then per group and octet of 8 columns a
    [W4_TILE lanes, 4] byte block, (q + 8) of columns 0..3 in the low nibbles and of 4..7 in the high ones. Rows
    past N: q = 0, m = 0."""
    N, Kp = q.shape
    ng, pad = Kp // W4_GROUP, (-N) % W4_TILE
    u = F.pad(q.to(torch.int16) + 8, (0, 0, 0, pad), value=8).to(torch.uint8)  # [Np, Kp]
    T = u.shape[0] // W4_TILE
    u = u.view(T, W4_TILE, ng, 4, 2, 4).permute(0, 2, 3, 1, 4, 5)  # [T, ng, octet, lane, lo/hi, c]
    nibbles = (u[..., 0, :] | (u[..., 1, :] << 4)).reshape(T, ng * 256)
    mt = F.pad(m, (0, 0, 0, pad)).view(T, W4_TILE, ng).transpose(1, 2).reshape(T, ng * W4_TILE)
    mt = F.pad(mt, (0, (-mt.shape[1]) % 64))
    return torch.cat([mt, nibbles], 1).contiguous()


def w4a8_mm_reference(x: torch.Tensor, q: torch.Tensor, m: torch.Tensor, S: torch.Tensor) -> torch.Tensor:
    """x [R, K] float -> [R, N] float32 = w4a8_mm's bits: each group's integer sum (float32 products and sums of
    integers below 2^24: exact), times its step m, summed in int64 (below 2^31 by w4a8_steps), then
    float(sum) * sx[r] * S[n]. The torch path where the kernel is not built."""
    R, K = x.shape
    N, Kp = q.shape
    ng = Kp // W4_GROUP
    xq, sx = quantize_rows(x)  # [R, K], [R]
    xg = F.pad(xq, (0, Kp - K)).float().view(R, ng, W4_GROUP)  # [R, ng, G]
    y = torch.empty(R, N, dtype=torch.float32)
    for n0 in range(0, N, LONG_PASS_ROWS):
        qg = q[n0:n0 + LONG_PASS_ROWS].float().view(-1, ng, W4_GROUP)  # [n, ng, G]
        dots = torch.einsum("rgk,ngk->rng", xg, qg)  # [R, n, ng]
        total = (dots.long() * m[n0:n0 + LONG_PASS_ROWS].long()).sum(-1)  # [R, n]
        y[:, n0:n0 + LONG_PASS_ROWS] = _scaled(total, sx, S[n0:n0 + LONG_PASS_ROWS])
    return y


class W4A8Linear:
    """y = x W^T + b with 4-bit weights in groups of W4_GROUP columns (quantize_w4a8) and int8 activations (each
    row rounded by its own scale, as W8A8Linear's): integer sums, through kernels/w4a8_mm.h (`own`: packed by
    pack_w4a8), else w4a8_mm_reference. Row-exact, and the same bits from every path."""

    __slots__ = ("q", "m", "s", "b", "n", "k", "min_rows", "own")

    def __init__(self, lin: Linear, own: bool):
        self.min_rows = lin.min_rows  # (Llama.use_onednn_single_row sets it; unused here)
        self.own = own
        q, m, self.s = quantize_w4a8(lin.w)  # [N, Kp], [N, ng], [N]
        self.n, self.k = lin.w.shape
        self.q, self.m = (pack_w4a8(q, m), None) if own else (q, m)
        self.b = None if lin.b is None else lin.b.float()

    @property
    def w(self) -> torch.Tensor:
        """The stored weight (packed: two weights a byte, and a byte of step per group of W4_GROUP)."""
        return self.q

    def __call__(self, x: torch.Tensor, exact: bool = False) -> torch.Tensor:
        """x [..., K] -> [..., N] in x's dtype; row-exact at every row count (integer sums: no order to keep)."""
        x2 = x.reshape(-1, self.k).float()  # [R, K]
        if self.own:
            y = torch.ops.trtspec.w4a8_mm(x2, self.q, self.s)
        else:
            y = w4a8_mm_reference(x2, self.q, self.m, self.s)
        y = y if self.b is None else y + self.b  # [R, N] float32
        return y.to(x.dtype).view(*x.shape[:-1], self.n)


def quantize_linear(lin: Linear, mode: str) -> Any:
    """The quantized twin of a runtime Linear (a new object)."""
    if lin.released:
        raise ValueError("this linear's plain weight was released after prepacking (Llama.from_dir): load the "
                         "model with quantization= instead of quantizing it afterwards")
    if mode == "int8":
        if lin.w.device.type == "cpu" and fused.available():
            return Int8Linear(lin, torch.float32, own=True)
        dt = int8_dtype(lin.w.dtype) if lin.w.device.type == "cpu" and lin.w.shape[1] % KERNEL_K == 0 else None
        if dt is not None:
            return Int8Linear(lin, dt)
        q, s = quantize_int8(lin.w)
        return Linear((q.float() * s[:, None]).to(lin.w.dtype), lin.b, single_row=lin.min_rows == 1)
    if mode == "w8a8":
        return W8A8Linear(lin, own=lin.w.device.type == "cpu" and fused.available())
    if mode == "w4a8":
        return W4A8Linear(lin, own=lin.w.device.type == "cpu" and fused.available())
    if mode == "int4":
        return Linear(quantize_int4(lin.w).to(lin.w.dtype), lin.b, single_row=lin.min_rows == 1)
    raise ValueError(f"unknown draft quantization {mode!r} (known: {', '.join(MODES)})")


def quantize_llama(model: Llama, mode: str) -> int:
    """Quantize a runtime Llama's layer linears and head in place (a drafter's, or the target's for
    model.quantization; its embedding stays as it is: a lookup reads one row); returns how many linears.
    A model already loaded with this quantization (Llama(quantization=...)) is left as it is."""
    n = 0
    if model.quantization == mode:
        return 1 + 4 * len(model.layers)
    for lw in model.layers:
        for field in ("qkv", "o", "gate_up", "down"):
            setattr(lw, field, quantize_linear(getattr(lw, field), mode))
            n += 1
    model.head = quantize_linear(model.head, mode)
    model.quantization = mode
    model.prepare_fused()  # the new linears, through the fused CPU kernel where it builds
    return n + 1


def quantize_proposer(proposer: Any, mode: str, target: Llama | None = None) -> int:
    """Quantize every drafter linear a proposer holds (see the module docstring); returns how many. The
    `target` (and any Linear whose weight is one of its tensors) is left alone, should a proposer hold it."""
    n = 0
    shared = set() if target is None else {t.data_ptr() for t in _tensors(target)}

    def twin(value: Any) -> Any:
        nonlocal n
        if isinstance(value, Linear):
            if value.w.data_ptr() in shared:
                return value
            n += 1
            return quantize_linear(value, mode)
        if isinstance(value, list) and value and all(isinstance(v, (Linear, list)) for v in value):
            new = [twin(v) for v in value]
            return value if all(a is b for a, b in zip(new, value)) else new
        return value

    for name, value in list(vars(proposer).items()):
        if isinstance(value, Llama):
            if value is not target:
                n += quantize_llama(value, mode)
        elif not isinstance(value, LayerWeights):
            new = twin(value)
            if new is not value:
                setattr(proposer, name, new)
    return n


def _tensors(model: Llama) -> list[torch.Tensor]:
    lins = [model.head] + [x for lw in model.layers for x in (lw.qkv, lw.o, lw.gate_up, lw.down)]
    return [model.embed, model.lm_head] + [lin.w for lin in lins if isinstance(lin, Linear) and not lin.released]
