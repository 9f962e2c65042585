"""Row-exact matmuls at real model widths (runtime/linear.py): oneDNN's result for a row depends on how many rows
share its call (its kernel and summation order follow the row count), so Linear calls it in fixed row blocks.
Every row of a pass of 1..16 rows (as a chain [1, T] or a batch [B, T]) equals, bit for bit, that row multiplied
alone, at the widths of SmolLM2-135M (576 / 1536), Qwen2.5-0.5B (896), Qwen2.5-1.5B (1536 / 8960) and 2048."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trtspec.runtime.dtypes import cpu_has_fast_bf16
from trtspec.runtime.linear import Linear, _onednn

SHAPES = [(576, 1536), (896, 896), (1536, 1536), (1536, 8960), (2048, 2048)]  # (N, K) of a weight [N, K]
DTYPES = [torch.float32] + ([torch.bfloat16] if cpu_has_fast_bf16() else [])
ROWS = 16


def _weight(shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(shape[0] * 7 + shape[1])
    return (torch.randn(*shape, generator=g) * 0.05).to(dtype)


def _rows(K: int, dtype) -> torch.Tensor:
    return torch.randn(ROWS, K, generator=torch.Generator().manual_seed(K)).to(dtype)  # [ROWS, K]


@pytest.fixture(scope="module", params=[(s, d) for s in SHAPES for d in DTYPES],
                ids=lambda p: f"{p[0][0]}x{p[0][1]}-{str(p[1])[6:]}")
def lin(request) -> Linear:
    shape, dtype = request.param
    m = Linear(_weight(shape, dtype), single_row=True)
    if m.packed is None:
        pytest.skip("no oneDNN here: F.linear serves")
    return m


@torch.inference_mode()
def test_every_row_of_a_pass_equals_the_row_alone(lin):
    x = _rows(lin.w.shape[1], lin.w.dtype)
    alone = torch.cat([lin(x[i:i + 1]) for i in range(ROWS)])  # [ROWS, N]: one-row decode steps
    torch.testing.assert_close(alone.float(), F.linear(x, lin.w).float(), rtol=2e-2, atol=2e-2)
    for m in range(1, ROWS + 1):
        assert torch.equal(lin(x[:m][None]), alone[:m][None]), f"a pass of {m} rows"
    for b, t in ((2, 8), (3, 5), (4, 4)):  # a batch: b rows of t tokens each
        assert torch.equal(lin(x[:b * t].view(b, t, -1)), alone[:b * t].view(b, t, -1)), f"a batch {b}x{t}"


@torch.inference_mode()
def test_onednn_at_the_pass_s_own_row_count_is_what_differs(lin):
    """The hazard the blocks remove, where this CPU shows it: oneDNN called once with all of a pass's rows."""
    x = _rows(lin.w.shape[1], lin.w.dtype)
    alone = torch.cat([lin(x[i:i + 1]) for i in range(ROWS)])
    differs = [m for m in range(1, ROWS + 1) if not torch.equal(_onednn(x[:m], lin.packed, None), alone[:m])]
    if not differs:
        pytest.skip("oneDNN alone is row-exact at this shape on this CPU")
    assert lin.rows[0] > 1 or lin.rows == (1, 1)


@torch.inference_mode()
def test_a_batch_of_short_passes_past_64_rows_stays_exact(lin):
    """A batch of 9 rows of 8 tokens (72 rows, as the LM head of a batched verify pass sees them): exact=True
    keeps the row blocks past EXACT_MAX_ROWS (oneDNN's bf16 kernel changes beyond 32 rows at every width)."""
    x = torch.randn(72, lin.w.shape[1], generator=torch.Generator().manual_seed(1)).to(lin.w.dtype)
    alone = torch.cat([lin(x[i:i + 1]) for i in range(72)])
    assert torch.equal(lin(x.view(9, 8, -1), exact=True), alone.view(9, 8, -1))


def _rowwise(x, w, b):  # [M, K] -> [M, N], each row alone: exact whatever the call's rows
    return torch.stack([w @ row for row in x])


def test_the_probe_checks_every_row_of_a_call(monkeypatch):
    """A kernel that sums only some row positions of a multi-row call in another order (as oneDNN does on an
    AMD EPYC, Zen 4: the fourth row of 4+ rows at 576 x 1536): the blocks the probe picks must keep every row of
    every pass equal to the row alone, not just the first, middle and last rows it once looked at."""
    import trtspec.runtime.linear as linear

    def kernel(x, w, b):  # rows 1, 5, 9, ... of a call of 4 or more rows come out otherwise
        y = _rowwise(x, w, b)  # [M, N]
        if x.shape[0] >= 4:
            y[1::4] += 1e-3
        return y

    monkeypatch.setattr(linear, "_onednn", kernel)
    shape = (24, 40)
    monkeypatch.setattr(linear, "_FOUND", {})
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(3))
    rows = linear.row_blocks(w, shape, torch.float32)
    x = torch.randn(40, shape[1], generator=torch.Generator().manual_seed(4))  # [40, K]
    alone = torch.cat([linear.blocked(x[i:i + 1], w, None, rows) for i in range(40)])
    for m in range(1, 41):
        assert torch.equal(linear.blocked(x[:m], w, None, rows), alone[:m]), f"{rows}: a pass of {m} rows"


def test_the_fast_exact_blocks_are_picked(monkeypatch):
    """A kernel whose calls of 1 or 2 rows are the slow path (oneDNN's bf16 on an AMD EPYC, Zen 4: a one-row
    decode step ~1.3x slower than one padded to 4 rows): the probe times the calls of lo rows cold and picks
    the fast blocks, every one of them exact here; a weight below TIMED_MIN_BYTES is not timed at all."""
    import time

    import trtspec.runtime.linear as linear

    def kernel(x, w, b):
        if x.shape[0] < 4:
            time.sleep(0.004)
        return _rowwise(x, w, b)

    monkeypatch.setattr(linear, "_onednn", kernel)
    monkeypatch.setattr(linear, "_FOUND", {})
    monkeypatch.setattr(linear, "FLUSH_BYTES", 1 << 20)
    big = (linear.TIMED_MIN_BYTES // 4 // 256, 256)  # float32 [N, K] of TIMED_MIN_BYTES
    assert linear.row_blocks(torch.randn(*big), big, torch.float32) == (4, 32)

    def untimed(*a, **k):
        raise AssertionError("a small weight was timed")

    monkeypatch.setattr(linear, "_cold_seconds", untimed)
    assert linear.row_blocks(torch.randn(8, 16), (8, 16), torch.float32) == (1, 32)
