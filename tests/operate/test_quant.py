"""speculative.draft_quantization: int8/int4 (weight-only) and W8A8 drafters in the torch runtime stay lossless
(greedy: token identity with plain decoding; sampling: the output distribution is the target's, chi-square),
change only the drafter, and are refused where they do not apply; quantized targets keep speculative decoding
token-identical to their own plain decoding."""

from __future__ import annotations

import pytest
import torch

from tests.runtime import family
from trtspec import methods
from trtspec.check import load_spec, spec_from_dict
from trtspec.errors import SpecError
from trtspec.runtime.quant import (
    Int8Linear,
    W4A8Linear,
    W8A8Linear,
    int8_kernel,
    int8_mm_reference,
    quantize_int4,
    quantize_int8,
    quantize_proposer,
)


def test_int8_per_channel_and_int4_per_group_levels():
    w = torch.randn(8, 70) * torch.linspace(0.1, 3, 8)[:, None]
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127
    assert ((q.float() * s[:, None] - w).abs() <= s[:, None] / 2 + 1e-6).all()
    w4 = quantize_int4(w)
    for row in range(8):
        for g in range(0, 70, 32):
            assert len(torch.unique(w4[row, g:g + 32])) <= 16  # 4-bit levels per (row, group)
    assert (w4 - w).abs().max() < w.abs().max() / 7


def test_int8_linear_matches_the_dequantized_product():
    from trtspec.runtime.llama import Linear

    lin = Linear(torch.randn(24, 64), torch.randn(24))
    if not int8_kernel(torch.float32):
        pytest.skip("this torch has no CPU _weight_int8pack_mm for float32 inputs (the dequantized path runs)")
    ql = Int8Linear(lin, torch.float32)
    x = torch.randn(2, 5, 64)
    q, s = quantize_int8(lin.w)
    assert torch.allclose(ql(x), torch.nn.functional.linear(x, q.float() * s[:, None], lin.b), atol=1e-3)


def test_int8_rows_are_computed_independently():
    """What keeps speculative decoding of an int8 target token-identical to plain decoding: a row's product
    does not depend on how many rows are multiplied with it (a verify pass vs a decode step)."""
    from trtspec.runtime.llama import Linear
    from trtspec.runtime.quant import quantize_linear

    ql = quantize_linear(Linear(torch.randn(96, 64), torch.randn(96)), "int8")
    x = torch.randn(1, 9, 64)
    batched = ql(x)
    assert all(torch.equal(ql(x[:, i:i + 1]), batched[:, i:i + 1]) for i in range(9))
    assert all(torch.equal(ql(x[:, :m]), batched[:, :m]) for m in range(1, 9))


def test_int8_of_a_width_the_kernel_cannot_take_dequantizes(monkeypatch):
    """_weight_int8pack_mm (torch 2.13) segfaults for an input width that is not a multiple of 8: where trtspec's
    own int8 kernel is not built, such a linear is dequantized instead (the int8 numbers, the float kernel)."""
    from trtspec.runtime import fused
    from trtspec.runtime.llama import Linear
    from trtspec.runtime.quant import quantize_linear

    monkeypatch.setattr(fused, "available", lambda: False)
    lin = Linear(torch.randn(16, 33))
    ql = quantize_linear(lin, "int8")
    assert not isinstance(ql, Int8Linear)
    q, s = quantize_int8(lin.w)
    x = torch.randn(3, 33)
    assert torch.allclose(ql(x), x @ (q.float() * s[:, None]).t(), atol=1e-5)


@pytest.mark.parametrize("shape", [(37, 70), (96, 64), (130, 1536), (5, 17), (16, 33), (9, 4200)])
def test_trtspecs_int8_kernel_is_the_dequantized_product_and_row_exact(shape):
    """kernels/int8_mm.h: each row of activations rounded to int16 by its own scale, exact integer sums: the very bits
    of int8_mm_reference, within 1e-4 of the dequantized float product, at any width (a tail past the vector lanes,
    sums past the kernel's int32 chunk) and any number of output channels (a tail past the tile); each row's result
    is bit-identical whatever rows share its call, up to and past the kernel's register block (6 rows) and its
    sweep of 64 rows."""
    from trtspec.runtime import fused
    from trtspec.runtime.llama import Linear
    from trtspec.runtime.quant import quantize_linear

    if not fused.available():
        pytest.skip("the fused kernel (and with it trtspec's int8 matmul) is not built here")
    lin = Linear(torch.randn(*shape), torch.randn(shape[0]))
    ql = quantize_linear(lin, "int8")
    assert isinstance(ql, Int8Linear) and ql.own and ql.s.dtype == torch.float32
    q, s = quantize_int8(lin.w)
    x = torch.randn(70, shape[1])
    y = ql(x, exact=True)
    assert y.dtype == torch.float32
    assert torch.equal(y, int8_mm_reference(x, q, s) + lin.b)  # (the op adds no bias: Int8Linear adds it after)
    dense = torch.nn.functional.linear(x, q.float() * s[:, None], lin.b)
    assert ((y - dense).abs().max() / dense.abs().max()).item() < 1e-4
    for rows in (1, 2, 5, 6, 7, 9, 13, 64, 65):
        assert torch.equal(ql(x[:rows], exact=True), y[:rows]), rows
    assert all(torch.equal(ql(x[i:i + 1]), y[i:i + 1]) for i in range(70))
    assert torch.equal(ql(x[3:11]), y[3:11])  # rows in another position of their call
    xb, sb = x[:7].bfloat16(), s.bfloat16()  # bfloat16 activations and scales: bfloat16 out, rows exact too
    yb = torch.ops.trtspec.int8_mm(xb, q, sb)
    assert yb.dtype == torch.bfloat16
    assert all(torch.equal(torch.ops.trtspec.int8_mm(xb[i:i + 1], q, sb), yb[i:i + 1]) for i in range(7))
    ref = y[:7] - lin.b  # (the op alone adds no bias)
    assert ((yb.float() - ref).abs().max() / ref.abs().max()).item() < 2e-2


def test_a_long_pass_of_an_int8_linear_is_row_exact_too():
    """More than EXACT_MAX_ROWS rows (a long prefill) run trtspec's kernel as a verify pass does (it is no slower
    there than a GEMM of widened weights): every row is the bits of its own one-row step, `exact` or not."""
    from trtspec.runtime import fused, quant
    from trtspec.runtime.attention import EXACT_MAX_ROWS
    from trtspec.runtime.llama import Linear

    if not fused.available():
        pytest.skip("the fused kernel (and with it trtspec's int8 matmul) is not built here")
    ql = quant.quantize_linear(Linear(torch.randn(40, 64), torch.randn(40)), "int8")
    x = torch.randn(2, EXACT_MAX_ROWS + 10, 64)  # 148 rows
    one_by_one = torch.cat([ql(x[:, i:i + 1]) for i in range(x.shape[1])], 1)
    assert torch.equal(ql(x), one_by_one)
    assert torch.equal(ql(x, exact=True), one_by_one)


@pytest.mark.parametrize("method, mode", [("draft-model", "int8"), ("ngram", "int8"), ("draft-model", "w8a8"),
                                          ("ngram", "w8a8"), ("draft-model", "w4a8")])
def test_int8_target_speculation_is_plain_decoding_of_it(fam, method, mode):
    """model.quantization = "int8", "w8a8" or "w4a8": the target's linears and head are quantized (W8A8 and W4A8:
    times int8 activations); speculative decoding of the quantized target gives its plain decoding's tokens."""
    from trtspec import methods
    from trtspec.runtime import SamplingParams

    data = load_spec(family.write_spec(fam, method, draft="draft_near")).to_dict()
    data["model"]["quantization"] = mode
    engine = methods.engine(spec_from_dict(data))
    kind = {"int8": Int8Linear, "w8a8": W8A8Linear, "w4a8": W4A8Linear}[mode]
    try:
        assert isinstance(engine.target.head, kind) and isinstance(engine.target.layers[0].gate_up, kind)
        assert engine.target.exact_attention  # runtime.torch.row_exact's default for a quantized target
        spec_out = engine.generate_batch(PROMPTS, SamplingParams(max_new_tokens=24))
        plain = [engine.generate(p, SamplingParams(max_new_tokens=24, num_draft_tokens=0)) for p in PROMPTS]
    finally:
        engine.close()
    assert [r.tokens for r in spec_out] == [r.tokens for r in plain]
    assert sum(r.accepted for r in spec_out) > 0


def _engine(fam, method, mode, **kw):
    spec = load_spec(family.write_spec(fam, method, draft="draft_near", **kw))
    data = spec.to_dict()
    data["speculative"]["draft_quantization"] = mode
    return methods.engine(spec_from_dict(data))


PROMPTS = ["w1 w2 w3 w4 w5", "w10 w20 w30", "w7 w7 w8 w9 w10"]


@pytest.mark.parametrize("method", ["draft-model", "eagle"])
@pytest.mark.parametrize("mode", ["int8", "int4", "w8a8", "w4a8"])
def test_quantized_drafter_greedy_is_plain_decoding(fam, method, mode):
    from trtspec.runtime import SamplingParams

    engine = _engine(fam, method, mode)
    try:
        assert engine.quantized_linears >= 5 and engine.draft_quantization == mode
        target_head = engine.target.head
        spec_out = engine.generate_batch(PROMPTS, SamplingParams(max_new_tokens=24))
        plain = engine.generate_batch(PROMPTS, SamplingParams(max_new_tokens=24, num_draft_tokens=0))
    finally:
        engine.close()
    assert [r.tokens for r in spec_out] == [r.tokens for r in plain]
    assert sum(r.drafted for r in spec_out) > 0
    assert engine.target.head is target_head and engine.target.head.w.dtype == torch.float32  # target untouched


def test_quantized_drafter_sampling_is_lossless(tmp_path):
    """20k seeded requests, vocab 8: the first two tokens after the prefill (one K = 2 step) follow the
    target's joint distribution with an int4 drafter, whose q differs from the float drafter's."""
    import sys

    sys.path.insert(0, str(family.Path(family.__file__).parent))
    from test_engine import _first_tokens_exact, _sampled_counts
    from test_rejection import chi2_z

    from trtspec.methods.draft_model import DraftModelProposer
    from trtspec.runtime import SamplingParams

    kw = dict(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, initializer_range=0.6, eos_token_id=None, bos_token_id=None)
    family.save_llama(tmp_path / "target", seed=21, **kw)
    family.save_noisy_copy(tmp_path / "target", tmp_path / "draft", noise=0.6, seed=22)

    class Int4Draft(DraftModelProposer):
        def setup(self, *args):
            plan = super().setup(*args)
            self.float_head = self.model.head.w.clone()
            assert quantize_proposer(self, "int4") >= 5
            return plan

    proposer = Int4Draft(tmp_path / "draft")
    sp = SamplingParams(max_new_tokens=3, temperature=0.9, top_k=6, num_draft_tokens=2)
    counts, eng, res = _sampled_counts(tmp_path, 20000, sp, [1, 2, 3], proposer=proposer)
    assert not torch.equal(proposer.model.head.w, proposer.float_head)  # the drafter is quantized
    acc = sum(r.accepted for r in res) / sum(r.drafted for r in res)
    assert 0.2 < acc < 0.9
    assert chi2_z(counts, _first_tokens_exact(eng.target, [1, 2, 3], sp)) < 4.0


@pytest.mark.parametrize("method, runtime, message", [
    ("lookahead", {}, "method 'lookahead' has no drafter weights to quantize"),
    ("draft-model", {"runtime": {"kind": "trtllm-engine", "device": "cuda"}, "gpu": {"type": "h100"}},
     "applies to the torch runtime"),
])
def test_draft_quantization_is_refused_where_it_does_not_apply(method, runtime, message):
    data = {"schema": 1, "model": {"target": "t"},
            "speculative": {"method": method, "draft_quantization": "int8",
                            **({"draft": "d"} if method == "draft-model" else {})}, **runtime}
    with pytest.raises(SpecError) as err:
        spec_from_dict(data)
    problem = next(p for p in err.value.problems if p.startswith("speculative.draft_quantization"))
    assert message in problem
    if runtime:
        assert "convert_checkpoint.py --use_weight_only --weight_only_precision int8" in problem


@pytest.mark.parametrize("mode, hint", [
    ("int8", "convert_checkpoint.py --use_weight_only --weight_only_precision int8"),
    ("w8a8", "convert_checkpoint.py --smoothquant 0.5 --per_channel --per_token"),
    ("w4a8", "quantize.py --qformat w4a8_awq")])
def test_target_quantization_is_refused_on_tensorrt_llm_runtimes(mode, hint):
    data = {"schema": 1, "model": {"target": "t", "quantization": mode}, "speculative": {"method": "none"},
            "runtime": {"kind": "trtllm-llmapi", "device": "cuda"}, "gpu": {"type": "h100"}}
    with pytest.raises(SpecError) as err:
        spec_from_dict(data)
    problem = next(p for p in err.value.problems if p.startswith("model.quantization"))
    algo = {"int8": "W8A16", "w8a8": "W8A8_SQ_PER_CHANNEL", "w4a8": "W4A8_AWQ"}[mode]
    assert "applies to the torch runtime" in problem and hint in problem and f"quant_algo={algo}" in problem


@pytest.mark.parametrize("mode", ["w8a8", "w4a8"])
@pytest.mark.parametrize("key", ["model", "speculative"])
def test_integer_kernels_are_refused_on_the_torch_runtime_s_gpu(key, mode):
    """W8A8 and W4A8 are trtspec's CPU integer kernels: the torch runtime on CUDA has no such path (torch._int_mm
    there wants 16+ rows), so check names the key rather than a decode step failing."""
    data = {"schema": 1, "model": {"target": "t"}, "speculative": {"method": "draft-model", "draft": "d"},
            "runtime": {"kind": "torch", "device": "cuda"}, "gpu": {"type": "h100"}}
    data[key]["quantization" if key == "model" else "draft_quantization"] = mode
    with pytest.raises(SpecError) as err:
        spec_from_dict(data)
    problem = next(p for p in err.value.problems if "quantization" in p)
    assert f"{mode} runs on CPU only" in problem and 'runtime.device = "cpu"' in problem
    data[key]["quantization" if key == "model" else "draft_quantization"] = "int8"
    spec_from_dict(data)  # int8 has a path there (dequantized)
