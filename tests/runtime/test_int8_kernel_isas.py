"""kernels/int8_mm.h, kernels/w8a8_mm.h and kernels/w4a8_mm.h on the CPUs this machine may not be: the fused
kernel is compiled for the CPU it runs on (-march=native), so its AVX2 + FMA variant (the fleet's AVX2-only
machines) and its plain-loop variant would otherwise never be compiled or run here. The three are built
together without the fused layer (the headers and one op each), once per instruction set, then checked as the
native ones are: the torch reference's very bits (integer sums, the same on every instruction set), and every row
bit-identical whatever rows share its call."""

from __future__ import annotations

import hashlib

import pytest
import torch

from trtspec.runtime import fused
from trtspec.runtime.dtypes import cpu_flags
from trtspec.runtime.quant import (
    int8_mm_reference,
    pack_tiles,
    pack_w4a8,
    quantize_int8,
    quantize_w4a8,
    w4a8_mm_reference,
    w8a8_mm_reference,
)

ISAS = {"avx2": ["-mavx2", "-mfma", "-mno-avx512f"], "plain": ["-mno-avx", "-mno-avx2", "-mno-fma", "-mno-avx512f"],
        # AVX-512 without VNNI (Skylake-X): runs only where the CPU has AVX-512 BW
        "avx512bw": ["-mavx2", "-mfma", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mno-avx512vnni"]}


def _runs_here(isa: str) -> bool:
    return isa != "avx512bw" or {"avx512f", "avx512bw", "avx512vl"} <= set(cpu_flags().split())


OP = """#include "int8_mm.h"
#include "w4a8_mm.h"
#include "w8a8_mm.h"
#include <torch/library.h>
TORCH_LIBRARY({ns}, m) {{
  m.def("int8(Tensor x, Tensor q, Tensor s) -> Tensor", &int8_rows_mm);
  m.def("w8a8(Tensor x, Tensor q, Tensor s) -> Tensor", &w8a8_rows_mm);
  m.def("w4a8(Tensor x, Tensor q, Tensor s) -> Tensor", &w4a8_rows_mm);
}}
"""


def _op(isa: str, kernel: str = "int8"):
    """The matmul of kernels/<kernel>_mm.h, built for `isa` (the three headers in one build per instruction set)."""
    if not _runs_here(isa):
        pytest.skip(f"this CPU cannot run the {isa} build")
    ns = f"trtspec_kernels_{isa}"
    if not hasattr(torch.ops, ns) or not hasattr(getattr(torch.ops, ns), kernel):
        flags = ["-O2", "-std=c++17", "-fopenmp", *ISAS[isa]]
        headers = sorted(fused.SOURCE.parent.glob("*.h"))
        digest = hashlib.sha256(b"".join(h.read_bytes() for h in headers) + OP.encode() + " ".join(flags).encode()
                                + torch.__version__.encode())
        name = f"{ns}_{digest.hexdigest()[:12]}"
        src = fused.build_dir(name) / f"{ns}.cpp"  # (in the build dir: one path, so a later run finds the build)
        src.write_text(OP.format(ns=ns))
        fused.load_extension(name, [src], flags, f"the matmul kernels for {isa}", include_dirs=(headers[0].parent,))
    return getattr(getattr(torch.ops, ns), kernel)


@pytest.mark.skipif(fused.compiler() is None, reason="no C++ compiler here")
@pytest.mark.parametrize("isa", list(ISAS))
@pytest.mark.parametrize("k", [70, 4200])
def test_the_int8_kernel_of_another_instruction_set_computes_the_same_bits(isa, k):
    mm = _op(isa)
    q, s = quantize_int8(torch.randn(37, k))  # a tail past the tile (37 = 9 x 4 + 1), the lanes (70, 4200), a chunk
    x = torch.randn(15, k) * torch.linspace(0.1, 5, 15)[:, None]
    y = mm(x, q, s)
    assert torch.equal(y, int8_mm_reference(x, q, s))
    assert all(torch.equal(mm(x[i:i + 1], q, s), y[i:i + 1]) for i in range(15))
    assert all(torch.equal(mm(x[:n], q, s), y[:n]) for n in (2, 5, 9, 13))


@pytest.mark.skipif(fused.compiler() is None, reason="no C++ compiler here")
@pytest.mark.parametrize("isa", list(ISAS))
def test_the_w8a8_kernel_of_another_instruction_set_computes_the_same_bits(isa):
    mm = _op(isa, "w8a8")
    q, s = quantize_int8(torch.randn(37, 70))  # a tail past the tile (37 = 2 x 16 + 5), past a chunk (70 = 64 + 6)
    x = torch.randn(15, 70) * torch.linspace(0.1, 5, 15)[:, None]
    y = mm(x, pack_tiles(q), s)
    assert torch.equal(y, w8a8_mm_reference(x, q, s))
    assert all(torch.equal(mm(x[i:i + 1], pack_tiles(q), s), y[i:i + 1]) for i in range(15))


@pytest.mark.skipif(fused.compiler() is None, reason="no C++ compiler here")
@pytest.mark.parametrize("isa", list(ISAS))
def test_the_w4a8_kernel_of_another_instruction_set_computes_the_same_bits(isa):
    mm = _op(isa, "w4a8")
    q, m, s = quantize_w4a8(torch.randn(37, 70))  # a tail past the tile (37 = 2 x 16 + 5), past a group (70)
    x = torch.randn(15, 70) * torch.linspace(0.1, 5, 15)[:, None]
    qp = pack_w4a8(q, m)
    y = mm(x, qp, s)
    assert torch.equal(y, w4a8_mm_reference(x, q, m, s))
    assert all(torch.equal(mm(x[i:i + 1], qp, s), y[i:i + 1]) for i in range(15))


@pytest.mark.skipif(fused.compiler() is None, reason="no C++ compiler here")
@pytest.mark.parametrize("isa", ["native", *ISAS])
@pytest.mark.parametrize("kernel", ["int8", "w8a8", "w4a8"])
def test_a_row_with_a_nan_or_an_infinity_gives_nan_and_leaves_the_other_rows(isa, kernel):
    """A row of activations rounded by its own scale must not round a NaN or an infinity into a finite integer (the
    largest magnitude would pass over a NaN, and the row would come out finite and wrong): its outputs are NaN, in
    every build (native: the fused kernel's own ops) and in the torch reference, and the rows beside it keep their
    bits."""
    if isa == "native" and not fused.available():
        pytest.skip("the fused kernel is not built here")
    mm = getattr(torch.ops.trtspec, f"{kernel}_mm") if isa == "native" else _op(isa, kernel)
    w = torch.randn(37, 70)
    if kernel == "w4a8":
        q, m, s = quantize_w4a8(w)
        weights, ref = pack_w4a8(q, m), (lambda x: w4a8_mm_reference(x, q, m, s))
    else:
        q, s = quantize_int8(w)
        weights = pack_tiles(q) if kernel == "w8a8" else q
        ref = (lambda x: w8a8_mm_reference(x, q, s)) if kernel == "w8a8" else (lambda x: int8_mm_reference(x, q, s))
    x = torch.randn(5, 70)
    clean = mm(x, weights, s)
    x[1, 3], x[3, 69] = float("nan"), float("inf")
    y = mm(x, weights, s)
    for out in (y, ref(x)):
        assert out[1].isnan().all() and out[3].isnan().all()
        assert torch.equal(out[[0, 2, 4]], clean[[0, 2, 4]])


@pytest.mark.skipif(fused.compiler() is None, reason="no C++ compiler here")
@pytest.mark.parametrize("isa", ["native", *ISAS])
@pytest.mark.parametrize("kernel", ["int8", "w8a8"])
def test_activations_round_half_to_even_in_the_vector_lanes_and_the_tail(isa, kernel):
    """Each row's activations are rounded to integers in vectors (16 or 8 lanes) and then one by one (the tail): both
    must round a half to the even integer, as torch.round and the references do. A row whose largest magnitude is
    the levels themselves has the scale 1, so an identity weight returns its integers: ties in every lane and in the
    tail (37 = 2 x 16 + 5 columns), negative ones, and -0.5 (to 0)."""
    if isa == "native" and not fused.available():
        pytest.skip("the fused kernel is not built here")
    mm = getattr(torch.ops.trtspec, f"{kernel}_mm") if isa == "native" else _op(isa, kernel)
    levels = 32767 if kernel == "int8" else 127
    K = 37
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-levels + 1, levels - 1, (4, K), generator=g).float() + 0.5  # [4, K], every value a tie
    x[:, 0] = levels  # the largest magnitude: scale 1
    x[1, 5], x[2, 36], x[3, 20] = -0.5, 0.5, -levels  # -0.5 -> 0 in a lane, 0.5 -> 0 in the tail
    q, s = torch.eye(K, dtype=torch.int8), torch.ones(K)
    y = mm(x, pack_tiles(q) if kernel == "w8a8" else q, s)
    want = torch.round(x)  # half to even
    assert torch.equal(y, want)
    assert (want != torch.floor(x + 0.5)).any()  # (ties to even differ from ties up here: the test can tell)


@pytest.mark.skipif(fused.compiler() is None, reason="no C++ compiler here")
@pytest.mark.parametrize("isa", ["native", *ISAS])
def test_the_int8_kernels_largest_sums_stay_exact(isa):
    """The int8 kernel sums a row's products in int32 lanes, pairs or fours of lanes still in int32, then in int64
    (kernels/int8_mm.h): the largest products (|q| = 128, |xq| = 32767) over whole chunks of columns and more must
    come out exact, of either sign, for every row count of a block, and each row as it would alone."""
    if isa == "native" and not fused.available():
        pytest.skip("the fused kernel is not built here")
    mm = torch.ops.trtspec.int8_mm if isa == "native" else _op(isa)
    K = 4200  # two chunks of 2048 columns and a tail
    q = torch.full((9, K), -128, dtype=torch.int8)  # [9, K]: tiles of 4 (AVX-512) and 2 (AVX2), and a last row
    q[4::2] = 127
    s = torch.ones(9)
    x = torch.ones(7, K)  # [7, K]: every activation rounds to +-32767
    x[1::2] = -1
    y = mm(x, q, s)
    assert torch.equal(y, int8_mm_reference(x, q, s))
    assert abs(y[0, 0] / (-128 * K) - 1) < 1e-6  # (a sum of -128 * 32767 * K, beyond int32: a wrap would show)
    assert all(torch.equal(mm(x[:n], q, s), y[:n]) for n in range(1, 7))
