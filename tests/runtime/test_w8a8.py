"""W8A8 linears (runtime/quant.py's W8A8Linear, kernels/w8a8_mm.h): int8 weights per output channel times
activations rounded to int8 per row, integer sums. The kernel computes the torch reference's bits (torch._int_mm),
every row the same whatever rows share its call, a long pass (a GEMM) too; the packed layout round-trips."""

from __future__ import annotations

import pytest
import torch

from trtspec.runtime import fused, quant
from trtspec.runtime.llama import Linear

SHAPES = [(37, 70), (96, 64), (130, 1536), (5, 17), (16, 33), (4, 128)]


def _kernel():
    if not fused.available():
        pytest.skip("the fused kernel (and with it the W8A8 matmul) is not built here")


@pytest.mark.parametrize("shape", [(1, 1), (5, 70), (8, 128), (9, 63), (20, 70), (33, 128)])
def test_the_packed_layout_round_trips_and_pads_with_zeros(shape):
    q = torch.randint(-127, 128, shape, dtype=torch.int8)
    qp = quant.pack_tiles(q)
    N, K = shape
    assert qp.shape == (-(-N // quant.TILE_ROWS) * quant.TILE_ROWS, -(-K // quant.TILE_COLS) * quant.TILE_COLS)
    assert torch.equal(quant.unpack_tiles(qp, N, K), q)
    assert int(qp.abs().sum()) == int(q.abs().sum())  # the padding is zeros
    if N >= 16 and K >= 8:  # tile 0's first two vectors: columns 0..3, then 4..7, of rows 0..15
        assert torch.equal(qp.flatten()[:128].view(2, 16, 4), q[:16, :8].view(16, 2, 4).transpose(0, 1))


def test_rows_round_half_to_even_within_127_levels_of_their_largest_magnitude():
    x = torch.tensor([[1.0, -2.0, 0.5 * 2 / 127, 1.5 * 2 / 127], [0.0, 0.0, 0.0, 0.0]])
    xq, sx = quant.quantize_rows(x)
    assert xq.tolist() == [[64, -127, 0, 2], [0, 0, 0, 0]]  # 63.5 -> 64, 0.5 -> 0, 1.5 -> 2 (half to even)
    assert sx.tolist() == pytest.approx([2 / 127, 0.0])


@pytest.mark.parametrize("shape", SHAPES)
def test_the_kernel_computes_the_reference_s_bits_and_rows_are_exact(shape):
    _kernel()
    lin = Linear(torch.randn(*shape), torch.randn(shape[0]), pack=False)
    ql = quant.quantize_linear(lin, "w8a8")
    assert isinstance(ql, quant.W8A8Linear) and ql.own
    q, s = quant.quantize_int8(lin.w)
    x = torch.randn(70, shape[1]) * torch.linspace(0.01, 10, 70)[:, None]  # rows of every scale
    x[5] = 0  # a row of zeros: zeros (plus the bias)
    ref = quant.w8a8_mm_reference(x, q, s) + lin.b
    y = ql(x[:64])
    assert y.dtype == torch.float32 and torch.equal(y, ref[:64])
    assert torch.equal(y[5], lin.b)
    for rows in (1, 2, 5, 6, 7, 9, 13, 64):
        assert torch.equal(ql(x[:rows]), ref[:rows]), rows
    assert all(torch.equal(ql(x[i:i + 1]), ref[i:i + 1]) for i in range(64))
    assert torch.equal(ql(x[3:11]), ref[3:11])  # rows in another position of their call
    assert torch.equal(ql(x), ref)  # 70 rows: a long pass, torch's int8 GEMM, the same bits
    deq = x @ (q.float() * s[:, None]).t() + lin.b  # the weight-only int8 product: int8 activations are close
    assert ((ref - deq).norm() / deq.norm()).item() < 2e-2


def test_bfloat16_activations_and_scales_give_bfloat16_rows_of_the_same_sums():
    _kernel()
    q, s = quant.quantize_int8(torch.randn(40, 96))
    qp, x = quant.pack_tiles(q), torch.randn(7, 96).bfloat16()
    y = torch.ops.trtspec.w8a8_mm(x, qp, s.bfloat16())
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, quant.w8a8_mm_reference(x, q, s.bfloat16()).bfloat16())
    assert all(torch.equal(torch.ops.trtspec.w8a8_mm(x[i:i + 1], qp, s.bfloat16()), y[i:i + 1]) for i in range(7))


def test_the_kernel_refuses_a_weight_that_is_not_packed():
    _kernel()
    q, s = quant.quantize_int8(torch.randn(6, 70))
    with pytest.raises(RuntimeError, match="packed in tiles"):
        torch.ops.trtspec.w8a8_mm(torch.randn(2, 70), q, s)  # q [6, 70] is not pack_tiles(q) [16, 128]


@pytest.mark.parametrize("mode, unpacked", [("w8a8", (24, 100)), ("w4a8", (24, 128))])
def test_without_the_kernel_the_torch_path_gives_the_same_bits(monkeypatch, mode, unpacked):
    """W8A8 and W4A8 alike (W4A8's unpacked weight is padded to whole groups of 32 columns)."""
    _kernel()
    lin = Linear(torch.randn(24, 100), torch.randn(24), pack=False)
    own = quant.quantize_linear(lin, mode)
    monkeypatch.setattr(fused, "available", lambda: False)
    torch_path = quant.quantize_linear(lin, mode)
    assert own.own and not torch_path.own and torch_path.q.shape == unpacked
    x = torch.randn(3, 5, 100)
    assert torch.equal(own(x), torch_path(x))
    assert torch.equal(own(x.bfloat16()), torch_path(x.bfloat16())) and own(x.bfloat16()).dtype == torch.bfloat16
