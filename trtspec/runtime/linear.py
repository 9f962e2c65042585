"""The runtime's matmul: `Linear`, a weight (and bias) kept prepacked for oneDNN on CPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ONEDNN_SINGLE_ROW_BYTES = 16 << 20  # models larger than this (half a typical L3) use oneDNN for one row too


class Linear:
    """y = x W^T + b. On CPU the weight is also kept prepacked for oneDNN, which multiplies several rows (a
    verify pass, a prefill) 2-7x faster than MKL's GEMM on this project's CPUs. For one row (a decode step)
    oneDNN wins on weights streamed from memory (a large model: ~1.7x), MKL on small, cache-resident ones:
    `single_row` picks oneDNN for one row too (Llama decides by model size). A weight stored in another dtype
    than the input (bf16 drafter weights) is multiplied in that dtype: input cast in, output cast back.

    `pack=False`: no prepacked copy (a weight about to be quantized). `release`: once prepacked for every row
    count (min_rows 1), the plain weight is never multiplied again, so it is released (`w` becomes a meta
    tensor: its shape and dtype without the bytes) rather than held beside its packed twin."""

    __slots__ = ("w", "b", "packed", "min_rows")

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None, single_row: bool = False,
                 dtype: torch.dtype | None = None, *, pack: bool = True, release: bool = False):
        if dtype is not None:
            w, b = w.to(dtype), (None if b is None else b.to(dtype))
        self.w, self.b = w, b
        self.packed = _onednn_pack(w) if pack else None
        self.min_rows = 1 if single_row or w.dtype == torch.bfloat16 else 2
        if release and self.packed is not None and self.min_rows == 1:
            self.w = w.to("meta")

    @property
    def released(self) -> bool:
        return self.w.device.type == "meta"

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
