"""The fused CPU decoder layer (runtime/fused.py, kernels/decode_layer.cpp) of int8, W8A8, bfloat16 and float32
models.

It computes what the torch path computes (float32: within 1e-4; bfloat16: up to bf16 rounding, both multiply in
bf16 activations; int8: up to the bf16 rounding of the torch path's int8 kernel, which the fused one does not
round; W8A8: the same matmuls, the rest in torch), for every architecture the runtime runs, and it is row-exact
itself: a verify pass's rows — a chain, a tree, the rows of a batch, inside or past a sliding window — give bit
for bit the logits of one-row decode steps (the torch path's float32 batched attention does not). bfloat16
models are the bf16 matmul weights a 16-bit spec gets on CPUs with native bf16 (runtime/dtypes.py), here forced
on every CPU."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from tests.architectures import models
from trtspec.runtime import fused
from trtspec.runtime.cache import chain_inputs, tree_inputs
from trtspec.runtime.llama import Llama
from trtspec.runtime.quant import quantize_llama

MAX = 96


def _model(path, kind: str, fused_on: bool = True) -> Llama:
    if fused_on and not fused.available():  # (test_the_kernel_builds_here... says why, where it should build)
        pytest.skip("the fused kernel is not available here")
    return _load(path, kind, fused_on)


def _load(path, kind: str = "int8", fused_on: bool = True) -> Llama:
    m = Llama.from_dir(path, dtype="float32", max_seq=MAX,
                       weight_dtype=torch.bfloat16 if kind == "bfloat16" else None)
    if kind in ("int8", "w8a8", "w4a8"):
        quantize_llama(m, kind)
    if not fused_on:
        for lw in m.layers:
            lw.fused = None
    return m


@pytest.fixture(params=["int8", "w8a8", "w4a8", "bfloat16", "float32"])
def kind(request) -> str:
    return request.param


@pytest.fixture(scope="module", params=list(models.CASES))
def arch(request, tmp_path_factory):
    model_type, kw = models.CASES[request.param]
    path = tmp_path_factory.mktemp(request.param) / "m"
    models.save(path, model_type, seed=3, tokenizer=False, **kw)
    return path


def _run(m: Llama, ids: list[int], prompt: int) -> torch.Tensor:
    """Logits after each token: a prefill of `prompt` tokens, then one-row decode steps."""
    cache = m.new_cache(1, MAX)
    inp = chain_inputs([0], prompt)
    lg, _ = m.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([ids[:prompt]]))
    out = [lg[0]]
    for n in range(prompt, len(ids)):
        inp = chain_inputs([n], 1)
        lg, _ = m.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([[ids[n]]]))
        out.append(lg[0])
    return torch.cat(out)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, models.family.VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.skipif(fused.compiler() is None, reason="no C++ compiler here: the kernel cannot be built")
def test_the_kernel_builds_here_and_int8_w8a8_bfloat16_and_float32_models_use_it(arch, kind):
    assert fused.available(), "the fused kernel did not build (see the warning logged by trtspec.runtime.fused)"
    assert all(lw.fused is not None for lw in _load(arch, kind).layers)


@torch.inference_mode()
def test_fused_layers_compute_what_the_torch_path_computes(arch, kind):
    ids = _ids(30, 1)  # past the sliding windows (8) of the window cases
    a, b = _run(_model(arch, kind), ids, 12), _run(_model(arch, kind, fused_on=False), ids, 12)
    if kind == "float32":
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)  # (the parity bound against transformers)
    else:
        assert ((a - b).norm() / b.norm()).item() < 2e-2
        assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.9


@torch.inference_mode()
def test_fused_verify_rows_equal_decoding_bit_for_bit(arch, kind, rows: int = 12):
    m = _model(arch, kind)
    ids = _ids(14 + rows, 2)
    plain = _run(m, ids, 14)  # rows 0..13: prefill, then one row per token
    cache = m.new_cache(1, MAX)
    inp = chain_inputs([0], 14)
    m.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([ids[:14]]))
    inp = chain_inputs([14], rows)  # a verify pass of the same tokens
    lg, _ = m.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([ids[14:]]))
    assert torch.equal(lg[0], plain[14:])


@torch.inference_mode()
def test_fused_tree_nodes_and_batch_rows_equal_decoding(arch, kind):
    m = _model(arch, kind)
    prompt, other = _ids(11, 3), _ids(7, 4)
    a, b = 41, 57
    # tree: root a, children b (of root) and a (of root), grandchild b (of the second child)
    nodes, parents = [a, b, a, b], (-1, 0, 0, 2)
    paths = {0: [a], 1: [a, b], 2: [a, a], 3: [a, a, b]}
    cache = m.new_cache(2, MAX)
    for row, ids in enumerate((prompt, other)):
        inp = chain_inputs([0], len(ids))
        m.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([ids]), row0=row)
    inp = tree_inputs([len(prompt), len(other)], [parents, (-1, 0, 1, 2)])
    tokens = torch.tensor([nodes, [a, b, a, b]])
    lg, _ = m.forward(cache, inp.positions, inp.start, inp.mask, tokens=tokens)
    for i, path in paths.items():
        assert torch.equal(lg[0, i], _run(m, prompt + path, len(prompt))[-1])
    assert torch.equal(lg[1], _run(m, other + [a, b, a, b], len(other))[-4:])


@torch.inference_mode()
def test_the_caller_s_tensors_are_not_written_and_captured_layers_are_each_layer_s(arch, kind):
    m = _model(arch, kind)
    embeds = torch.randn(1, 5, m.cfg.hidden_size)
    before = embeds.clone()
    m.capture_layers = (0, 1)
    inp = chain_inputs([0], 5)
    _, feats = m.forward(m.new_cache(1, MAX), inp.positions, inp.start, inp.mask, embeds=embeds)
    assert torch.equal(embeds, before)
    first = m.hidden(embeds, m.new_cache(1, MAX), inp.positions, inp.start, inp.mask, layers=m.layers[:1])
    H = m.cfg.hidden_size
    assert torch.equal(feats[..., :H], first)
    assert not torch.equal(feats[..., H:], first)


def test_turned_off_or_unbuildable_it_leaves_the_torch_path(arch, monkeypatch, caplog):
    fused.available.cache_clear()
    try:
        monkeypatch.setenv("TRTSPEC_FUSED", "0")
        assert not fused.available() and all(lw.fused is None for lw in _load(arch).layers)
        fused.available.cache_clear()
        monkeypatch.delenv("TRTSPEC_FUSED")

        def broken(**_):
            raise RuntimeError("Error building extension 'x'\nno C++ compiler")

        monkeypatch.setattr("torch.utils.cpp_extension.load", broken)
        monkeypatch.setattr(fused, "build_name", lambda: "trtspec_fused_test_unbuildable")
        monkeypatch.setenv("TRTSPEC_KERNEL_CACHE", str(arch.parent / "kernels"))
        with caplog.at_level(logging.WARNING, logger="trtspec.runtime.fused"):
            assert not fused.available()
        assert "no C++ compiler" in caplog.text and "torch path" in caplog.text
        m = _load(arch)
        assert all(lw.fused is None for lw in m.layers)
        ids = _ids(20, 5)
        with torch.inference_mode():
            assert _run(m, ids, 10).shape == (20, models.family.VOCAB)
    finally:
        fused.available.cache_clear()


@torch.inference_mode()
def test_the_kernel_refuses_rows_slots_and_positions_outside_its_tensors(arch, kind):
    m = _model(arch, kind)
    op, args = m.layers[0].fused
    cache, c = m.new_cache(1, MAX), m.cfg

    def call(row0=0, start=0, pos=0):
        op(torch.zeros(1, c.hidden_size), *args, cache.k[0], cache.v[0], row0, torch.tensor([[pos]]), [start],
           m.rope, None, c.num_heads, c.num_kv_heads)

    call()  # in range: runs
    with pytest.raises(RuntimeError, match="rows outside the cache"):
        call(row0=1)
    with pytest.raises(RuntimeError, match="wider than the cache"):
        call(start=MAX)
    with pytest.raises(RuntimeError, match="out of range"):
        call(pos=m.rope.shape[0])


def test_the_build_dir_is_private_and_falls_back_to_the_temp_dir(tmp_path, monkeypatch):
    import os
    import tempfile

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(OSError, match="not a private directory"):
        fused.private_dir(shared)
    monkeypatch.setenv("TRTSPEC_KERNEL_CACHE", str(shared))  # anyone could swap a build dir inside it
    monkeypatch.setattr(tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    d = fused.build_dir("trtspec_fused_x")
    assert d == tmp_path / "tmp" / f"trtspec-kernels-{os.getuid()}" / "trtspec_fused_x"
    assert d.stat().st_mode & 0o777 == 0o700
    monkeypatch.setenv("TRTSPEC_KERNEL_CACHE", str(tmp_path / "mine"))
    assert fused.build_dir("trtspec_fused_x") == tmp_path / "mine" / "trtspec_fused_x"


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A model whose MLP is as wide as Qwen2.5-1.5B's (8960): there oneDNN's result for a row depends on the
    number of rows of its call (runtime/linear.py), which the tiny models' widths (64, 128) hide."""
    path = tmp_path_factory.mktemp("wide") / "m"
    models.save(path, "qwen2", seed=3, tokenizer=False, intermediate_size=8960)
    return path


@torch.inference_mode()
def test_verify_rows_equal_decoding_at_a_real_mlp_width(wide, kind):
    for rows in (5, 12, 40):  # 40: past the 32 rows where oneDNN's bf16 kernel changes at every width
        test_fused_verify_rows_equal_decoding_bit_for_bit(wide, kind, rows)
    test_fused_tree_nodes_and_batch_rows_equal_decoding(wide, kind)


@pytest.fixture(scope="module", params=[152, 96, 64])
def wide_heads(request, tmp_path_factory):
    """Heads wider than the tiny models' (16 floats, one vector). The kernel's attention takes a head's values in
    blocks of 8, 4, 2 and one vectors, then column by column (152 = 128 + 16 + 8 with AVX-512, 2 x 64 + 3 x 8 with
    AVX2; 96 = 64 + 32; 64 = 4 vectors, SmolLM2's heads), and its keys in blocks of 16 slots (8 with AVX2) where
    the head is whole vectors (96 and 64; 152 takes a dot per slot), in tiles of slots (64 slots for 64 floats:
    the 96 slots here span two)."""
    path = tmp_path_factory.mktemp(f"heads{request.param}") / "m"
    models.save(path, "llama", seed=3, tokenizer=False, head_dim=request.param)
    return path


@torch.inference_mode()
def test_heads_wider_than_the_vector_blocks_compute_what_the_torch_path_computes(wide_heads, kind):
    test_fused_layers_compute_what_the_torch_path_computes(wide_heads, kind)
    test_fused_verify_rows_equal_decoding_bit_for_bit(wide_heads, kind)


@pytest.fixture(params=[2, 3])
def threads(request):
    """The tests here run on one thread (conftest); a pass splits its attention and its matmuls among the threads
    there are, and what a thread takes must not enter a row's numbers (nor leave a share empty or negative)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@torch.inference_mode()
def test_rows_stay_exact_whatever_the_threads_share(wide_heads, kind, threads):
    for rows in (1, 5, 12):
        test_fused_verify_rows_equal_decoding_bit_for_bit(wide_heads, kind, rows)
    test_fused_tree_nodes_and_batch_rows_equal_decoding(wide_heads, kind)


@pytest.mark.parametrize("drafter", ["bfloat16", "int8", "w8a8", "w4a8"])
def test_a_draft_model_drafter_runs_through_the_fused_kernel(arch, drafter):
    """The draft-model drafter's layers take the same fused kernel as a target: bf16 weights (what draft_dtype
    gives a large drafter on CPUs with native bf16) or a weight-only int8 drafter (draft_quantization)."""
    from trtspec.methods.draft_model import DraftModelProposer
    from trtspec.runtime.quant import quantize_proposer

    target = _model(arch, "float32")
    p = DraftModelProposer(arch, weight_dtype=torch.bfloat16 if drafter == "bfloat16" else None)
    p.setup(target, 1, MAX, 4)
    if drafter != "bfloat16":
        quantize_proposer(p, drafter, target)
    names = {lw.fused[0]._qualified_op_name for lw in p.model.layers}
    assert names == {f"trtspec::decode_layer_{'bf16' if drafter == 'bfloat16' else drafter}"}


def test_a_lock_left_by_a_killed_build_does_not_hang_the_next_one(tmp_path, monkeypatch, caplog):
    """torch's cpp_extension waits without end on a `lock` file in the build dir; a build killed midway leaves
    one. The next build must remove it (its own flock proves nobody holds it) before torch looks."""
    import torch.utils.cpp_extension as ext

    monkeypatch.setenv("TRTSPEC_KERNEL_CACHE", str(tmp_path))
    monkeypatch.delenv("TRTSPEC_FUSED", raising=False)
    where = fused.build_dir(fused.build_name())
    (where / "lock").write_text("")  # what a killed build leaves
    seen = []
    monkeypatch.setattr(ext, "load", lambda **kw: seen.append((Path(kw["build_directory"]) / "lock").exists()))
    fused.available.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="trtspec.runtime.fused"):
            fused.available()
    finally:
        fused.available.cache_clear()
    assert seen == [False], "torch would have waited forever on the leftover lock"
    assert "left by a kernel build that was killed" in caplog.text


def test_two_checkouts_of_the_same_source_build_apart(tmp_path, monkeypatch):
    """torch's build file names the source's path and torch's: one build dir shared by two checkouts (or two
    environments) is rewritten by each in turn, and every rewrite recompiles at the next engine load."""
    other = tmp_path / "checkout" / "decode_layer.cpp"
    other.parent.mkdir()
    other.write_bytes(fused.SOURCE.read_bytes())  # the very same source, elsewhere
    here = fused.build_name()
    monkeypatch.setattr(fused, "SOURCE", other)
    assert fused.build_name() != here
    monkeypatch.setattr(fused, "SOURCE", Path(str(other)))
    assert fused.build_name() == fused.build_name()  # and stable for one checkout


def test_a_changed_header_beside_the_source_names_another_build(tmp_path, monkeypatch):
    """decode_layer.cpp includes kernels/int8_mm.h: a build named by the .cpp alone would keep running the old
    int8 matmul after the header changed."""
    src = tmp_path / "decode_layer.cpp"
    src.write_bytes(fused.SOURCE.read_bytes())
    header = tmp_path / "int8_mm.h"
    header.write_bytes((fused.SOURCE.parent / "int8_mm.h").read_bytes())
    monkeypatch.setattr(fused, "SOURCE", src)
    before = fused.build_name()
    header.write_bytes(header.read_bytes() + b"\n// changed\n")
    assert fused.build_name() != before


def test_every_header_the_kernel_includes_ships_in_the_package():
    """A header left out of the wheel's package data would leave an installed trtspec without its fused kernel
    (the build fails: the torch path, slower, with one warning)."""
    import re
    import tomllib

    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["trtspec"]
    included = re.findall(r'#include "([^"]+)"', fused.SOURCE.read_text())
    assert included, "decode_layer.cpp includes its headers by quoted name"
    for name in included:
        path = fused.SOURCE.parent / name
        assert path.is_file(), name
        rel = path.relative_to(root / "trtspec")
        assert any(rel.match(g.removeprefix("**/")) for g in globs), f"{rel} is not in the package data"


def test_extra_kernel_flags_are_appended_and_name_another_build(monkeypatch):
    """TRTSPEC_KERNEL_FLAGS builds another variant (`-mno-avx512f`: the AVX2 kernel on an AVX-512 machine): its
    flags come after -march=native, so they win, and the build it names is not the native one's."""
    monkeypatch.delenv("TRTSPEC_KERNEL_FLAGS", raising=False)
    native = fused.build_name()
    assert fused.flags() == fused.FLAGS
    monkeypatch.setenv("TRTSPEC_KERNEL_FLAGS", "-mno-avx512f  -DX='a b'")
    assert fused.flags() == [*fused.FLAGS, "-mno-avx512f", "-DX=a b"]
    assert fused.build_name() != native
