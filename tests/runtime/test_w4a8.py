"""W4A8 linears (runtime/quant.py's W4A8Linear, kernels/w4a8_mm.h): 4-bit weights in groups of 32 columns, each
group's scale an integer step of its row's scale, times activations rounded to int8 per row: integer sums. The
kernel computes the torch reference's bits, every row the same whatever rows share its call; the packed layout
is the one the kernel's header describes; no sum can leave int32."""

from __future__ import annotations

import pytest
import torch

from trtspec.runtime import fused, quant
from trtspec.runtime.llama import Linear

SHAPES = [(37, 70), (16, 32), (130, 1536), (5, 17), (33, 100)]


def _kernel():
    if not fused.available():
        pytest.skip("the fused kernel (and with it the W4A8 matmul) is not built here")


def test_groups_round_to_4_bit_levels_of_an_integer_step_of_the_row_scale():
    w = torch.randn(6, 70) * torch.logspace(-3, 1, 6)[:, None]
    w[2, 32:64] = 0  # a group of zeros: step 0
    q, m, S = quant.quantize_w4a8(w)
    assert q.shape == (6, 96) and m.shape == (6, 3) and S.shape == (6,)
    assert q.dtype == torch.int8 and int(q.min()) >= -8 and int(q.max()) <= 7
    assert torch.equal(q[:, 70:], torch.zeros(6, 26, dtype=torch.int8))  # the padding
    assert int(m[2, 1]) == 0 and int(m.max()) == quant.w4a8_steps(3) and bool((m[torch.arange(6) != 2] > 0).all())
    deq = (q.float().view(6, 3, 32) * (S[:, None] * m.float())[..., None]).view(6, 96)[:, :70]
    assert ((deq - w).norm(dim=1) / w.norm(dim=1)).max().item() < 0.15  # 4 bits: ~0.1 on normal weights


def test_steps_keep_every_sum_inside_int32():
    for ng in (1, 48, 280, 592, 2047):
        steps = quant.w4a8_steps(ng)
        assert 1 <= steps <= 255 and steps * quant.W4_DOT_MAX * ng < 2**31
    assert quant.w4a8_steps(48) == 255 and quant.w4a8_steps(592) < 255  # wide weights get fewer steps


def test_the_packed_layout_is_the_kernel_s():
    q = torch.randint(-8, 8, (17, 64), dtype=torch.int8)
    m = torch.randint(0, 256, (17, 2), dtype=torch.uint8)
    qp = quant.pack_w4a8(q, m)
    assert qp.dtype == torch.uint8 and qp.shape == (2, 64 + 2 * 256)  # tiles of 16 rows; m padded to 64 bytes
    assert torch.equal(qp[0, :32].view(2, 16), m[:16].t())  # tile 0's steps, group by group
    assert int(qp[1, 0]) == int(m[16, 0]) and int(qp[1, 1:16].sum()) == 0  # rows past N: step 0
    lane, c, octet, g = 3, 2, 1, 1  # group 1, octet 1: columns 40..43 (low nibbles) and 44..47 (high)
    byte = int(qp[0, 64 + g * 256 + octet * 64 + lane * 4 + c])
    assert byte & 15 == int(q[lane, 32 + 8 * octet + c]) + 8 and byte >> 4 == int(q[lane, 32 + 8 * octet + 4 + c]) + 8


@pytest.mark.parametrize("shape", SHAPES)
def test_the_kernel_computes_the_reference_s_bits_and_rows_are_exact(shape):
    _kernel()
    lin = Linear(torch.randn(*shape), torch.randn(shape[0]), pack=False)
    ql = quant.quantize_linear(lin, "w4a8")
    assert isinstance(ql, quant.W4A8Linear) and ql.own
    q, m, S = quant.quantize_w4a8(lin.w)
    x = torch.randn(70, shape[1]) * torch.linspace(0.01, 10, 70)[:, None]  # rows of every scale
    x[5] = 0  # a row of zeros: zeros (plus the bias)
    ref = quant.w4a8_mm_reference(x, q, m, S) + lin.b
    y = ql(x)  # 70 rows: past the kernel's sweep of 64
    assert y.dtype == torch.float32 and torch.equal(y, ref)
    assert torch.equal(y[5], lin.b)
    for rows in (1, 2, 5, 6, 7, 9, 13, 64):
        assert torch.equal(ql(x[:rows]), ref[:rows]), rows
    assert all(torch.equal(ql(x[i:i + 1]), ref[i:i + 1]) for i in range(70))
    assert torch.equal(ql(x[3:11]), ref[3:11])  # rows in another position of their call
    exact = x @ lin.w.t() + lin.b
    assert ((ref - exact).norm() / exact.norm()).item() < 0.15  # 4-bit weights, int8 activations


def test_sums_near_the_int32_bound_stay_exact():
    """Every weight at -8 and every activation at its largest level: each group's sum is the bound W4_DOT_MAX,
    times the largest step, over 592 groups (a 18944-wide down projection)."""
    _kernel()
    K = 592 * 32
    w = torch.full((16, K), -1.0)
    q, m, S = quant.quantize_w4a8(w)
    q.fill_(-8)
    x = torch.ones(2, K)
    qp = quant.pack_w4a8(q, m)
    y = torch.ops.trtspec.w4a8_mm(x, qp, S)
    assert torch.equal(y, quant.w4a8_mm_reference(x, q, m, S))
    total = -8 * 127 * K * int(m[0, 0])
    assert total > -(2**31) and torch.equal(y[0], torch.full((16,), float(total)) * (1.0 / 127) * S)


def test_bfloat16_activations_and_scales_give_bfloat16_rows_of_the_same_sums():
    _kernel()
    q, m, S = quant.quantize_w4a8(torch.randn(40, 96))
    qp, x = quant.pack_w4a8(q, m), torch.randn(7, 96).bfloat16()
    y = torch.ops.trtspec.w4a8_mm(x, qp, S.bfloat16())
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, quant.w4a8_mm_reference(x, q, m, S.bfloat16()).bfloat16())
    assert all(torch.equal(torch.ops.trtspec.w4a8_mm(x[i:i + 1], qp, S.bfloat16()), y[i:i + 1]) for i in range(7))


def test_the_kernel_refuses_a_weight_that_is_not_packed():
    _kernel()
    q, m, S = quant.quantize_w4a8(torch.randn(6, 70))
    with pytest.raises(RuntimeError, match="pack_w4a8"):
        torch.ops.trtspec.w4a8_mm(torch.randn(2, 70), q.view(torch.uint8), S)
