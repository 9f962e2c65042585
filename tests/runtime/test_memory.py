"""Loading without copies: the same numbers as the eager, all-float32 load; one target per process; a load or a
KV cache that would not fit is refused before it is made (MemoryBudgetError)."""

from __future__ import annotations

import pytest
import torch

from tests.runtime import family
from trtspec.artifacts.hf import ModelConfig
from trtspec.artifacts.weights import load_file, load_weights, open_weights
from trtspec.errors import MemoryBudgetError, ModelError
from trtspec.runtime import llama as L, loaded, memory
from trtspec.runtime.quant import quantize_llama


@pytest.fixture(scope="module")
def bf16_dir(tmp_path_factory):
    """A tiny tied Qwen2-shaped model (q/k/v biases) stored in bfloat16, as the real pair is."""
    path = tmp_path_factory.mktemp("bf16") / "m"
    model = family.save_llama(path, seed=11, tie_word_embeddings=True)
    model.to(torch.bfloat16).save_pretrained(path)
    return path


def test_lazy_weights_read_what_safetensors_reads(bf16_dir, tmp_path):
    eager = load_file(bf16_dir / "model.safetensors")
    lazy = open_weights(bf16_dir)
    assert set(lazy) == set(eager) and len(lazy) == len(eager)
    for k, v in eager.items():
        t = lazy[k]
        assert t.dtype == v.dtype and torch.equal(t, v)
        assert t.data_ptr() != lazy[k].data_ptr()  # a fresh tensor each time: nothing is cached
    cut = tmp_path / "cut"
    cut.mkdir()
    (cut / "model.safetensors").write_bytes((bf16_dir / "model.safetensors").read_bytes()[:-64])
    w = open_weights(cut)
    last = max(w.where, key=lambda k: w.where[k][2]["data_offsets"][1])
    with pytest.raises(ModelError, match="past the end of the file"):
        w[last]


def _logits(m: L.Llama, ids: list[int]) -> torch.Tensor:
    from trtspec.runtime.cache import chain_inputs

    cache = m.new_cache(1, 64)
    inp = chain_inputs([0], len(ids))
    lg, _ = m.forward(cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([ids]))
    return lg


@pytest.mark.parametrize("wdt", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("quantization", [None, "int8"])
@pytest.mark.parametrize("big", [False, True])
def test_from_dir_computes_what_the_eager_float32_load_did(bf16_dir, wdt, quantization, big, monkeypatch):
    """The old load: every tensor read at once, cast to float32, then to the matmul dtype, prepacked, the plain
    weights kept, quantized afterwards. from_dir now reads tensor by tensor into their final dtype, keeps the
    embedding in bf16, quantizes as it loads and releases prepacked weights: the logits are the same bits."""
    if big:  # the large-model path: oneDNN for one row, fp32 weights released too
        monkeypatch.setattr(L, "ONEDNN_SINGLE_ROW_BYTES", 0)
    cfg = ModelConfig.from_dir(bf16_dir)
    old = L.Llama(cfg, {k: v.float() for k, v in load_weights(bf16_dir).items()}, weight_dtype=wdt, max_seq=64)
    if quantization:
        quantize_llama(old, quantization)
    new = L.Llama.from_dir(bf16_dir, weight_dtype=wdt, max_seq=64, quantization=quantization)
    assert new.embed.dtype == torch.bfloat16 and old.embed.dtype == torch.float32
    ids = [1, 5, 9, 33, 2, 70, 11]
    assert torch.equal(_logits(new, ids), _logits(old, ids))
    lins = [new.head] + [x for lw in new.layers for x in (lw.qkv, lw.o, lw.gate_up, lw.down)]
    if quantization is None and (big or wdt == torch.bfloat16) and all(x.packed is not None for x in lins):
        assert all(x.released for x in lins)  # no plain copy beside the packed one
        assert new.num_params == old.num_params
        with pytest.raises(ValueError, match="released"):
            quantize_llama(new, "int4")


def test_engines_over_one_target_share_it(tmp_path):
    from trtspec import methods
    from trtspec.check import load_spec

    root = family.build_family(tmp_path)
    a = methods.engine(load_spec(family.write_spec(root, "draft-model", k=4)))
    b = methods.engine(load_spec(family.write_spec(root, "ngram", k=2, max_output_len=32)))
    try:
        assert a.target is not b.target and a.target.max_seq != b.target.max_seq  # each its own view...
        assert a.target.layers is b.target.layers and a.target.embed is b.target.embed  # ...of one model
        prompt = [1, 2, 3, 4]
        from trtspec.runtime import SamplingParams

        sp = SamplingParams(max_new_tokens=12, num_draft_tokens=0)
        ref = L.Llama.from_dir(root / "target")  # a load of its own
        from trtspec.runtime.engine import SpecEngine

        alone = SpecEngine(ref, None, max_input_len=64, max_output_len=64)
        assert a.generate(prompt, sp).tokens == b.generate(prompt, sp).tokens == alone.generate(prompt, sp).tokens
    finally:
        a.close()
        b.close()
    ident = loaded._key(root / "target", "float32", "cpu", None, None, False)
    del a, b
    import gc

    gc.collect()
    assert ident not in loaded._LOADED  # freed with the last engine that held it


def test_quantized_and_float_targets_are_separate_models(tmp_path):
    root = tmp_path
    family.save_llama(root / "t", seed=3)
    f = loaded.load_model(root / "t", max_seq=32)
    q = loaded.load_model(root / "t", max_seq=32, quantization="int8", row_exact=True)
    again = loaded.load_model(root / "t", max_seq=48)
    assert q.layers is not f.layers and again.layers is f.layers and again.max_seq == 48 and f.max_seq == 32
    family.save_llama(root / "t", seed=4)  # rewritten in place: loaded anew
    assert loaded.load_model(root / "t", max_seq=32).layers is not f.layers


@pytest.mark.parametrize("text, n", [("6G", 6 << 30), ("512M", 512 << 20), ("1.5GiB", 3 << 29), ("1000", 1000)])
def test_parse_size(text, n):
    assert memory.parse_size(text) == n


def test_a_model_that_does_not_fit_is_refused_before_loading(tmp_path, monkeypatch):
    family.save_llama(tmp_path / "t", seed=3)
    need = loaded.model_bytes(tmp_path / "t")
    assert need >= 4 * sum(v.numel() for v in load_weights(tmp_path / "t").values())
    monkeypatch.setenv(memory.ENV, str(need - 1))
    loads = []
    monkeypatch.setattr(L.Llama, "from_dir", classmethod(lambda *a, **k: loads.append(1)))
    with pytest.raises(MemoryBudgetError, match=r"not enough memory for t \(.*\): it needs .* GB, .* GB is "
                                                r"available \(TRTSPEC_AVAILABLE_MEMORY\)") as e:
        loaded.load_model(tmp_path / "t")
    assert not loads and e.value.exit_code == 7 and "quantization" in e.value.hint


def test_a_kv_cache_that_does_not_fit_is_refused(tmp_path, monkeypatch):
    family.save_llama(tmp_path / "t", seed=3)
    m = loaded.load_model(tmp_path / "t")
    monkeypatch.setenv(memory.ENV, "1M")
    with pytest.raises(MemoryBudgetError, match=r"t's KV cache \(64 rows x 512 slots, 2 layers\): it needs"):
        loaded.new_cache(m, 64, 512)
    assert loaded.new_cache(m, 1, 64).k.numel() == 2 * 1 * 2 * 64 * 16  # (small enough: made)


def test_available_reads_the_machine_and_the_override(monkeypatch):
    monkeypatch.delenv(memory.ENV, raising=False)
    avail, where = memory.available()
    assert avail is not None and avail > 0 and where
    monkeypatch.setenv(memory.ENV, "off")
    assert memory.available() == (None, memory.ENV)
    monkeypatch.setenv(memory.ENV, "lots")
    with pytest.raises(MemoryBudgetError, match="not a size"):
        memory.available()


def test_cli_exits_7_naming_what_it_needs(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from trtspec.cli import main

    root = family.build_family(tmp_path)
    spec = family.write_spec(root, "draft-model")
    monkeypatch.setenv(memory.ENV, "100K")
    r = CliRunner().invoke(main, ["generate", "--local", "-c", str(spec), "-p", "w1 w2", "--max-tokens", "2"])
    assert r.exit_code == 7, r.output
    assert "error: not enough memory for target" in r.output and "hint:" in r.output


def test_bench_local_over_one_target_loads_it_once(tmp_path, monkeypatch):
    """`trtspec bench --local` with three specs of one target (draft-model at K = 4 and 2, ngram): the target and
    the drafter are each read from disk once."""
    import json

    from click.testing import CliRunner

    from trtspec.cli import main

    root = family.build_family(tmp_path)
    specs = [family.write_spec(root, "draft-model"),
             family.write_spec(root, "draft-model", k=2),
             family.write_spec(root, "ngram", k=2)]
    loads: list[str] = []
    real = L.Llama.from_dir.__func__

    def counting(cls, path, **kw):
        loads.append(f"{L.Path(path).name}:{kw.get('quantization')}")
        return real(cls, path, **kw)

    monkeypatch.setattr(L.Llama, "from_dir", classmethod(counting))
    (tmp_path / "p.txt").write_text("w1 w2 w3\n")
    argv = ["bench", "--local", "-n", "1", "--max-tokens", "4", "--json", "--prompts", str(tmp_path / "p.txt")]
    r = CliRunner().invoke(main, [*argv, *[a for s in specs for a in ("-c", str(s))]])
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.output[r.output.index("["):])) == 3
    assert sorted(loads) == ["draft:None", "target:None"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_quantization_in_row_blocks_is_the_whole_matrix_at_once(dtype, monkeypatch):
    from trtspec.runtime import quant

    w = (torch.randn(300, 64, generator=torch.Generator().manual_seed(0)) * 0.05).to(dtype)
    wf = w.float()
    s = (wf.abs().amax(1) / 127.0).clamp_min(1e-12)
    whole = torch.round(wf / s[:, None]).clamp(-127, 127).to(torch.int8)
    monkeypatch.setattr(quant, "CHUNK_BYTES", 7 * 64 * 4)  # blocks of 7 rows, the last one short
    q, scales = quant.quantize_int8(w)
    assert torch.equal(q, whole) and torch.equal(scales, s)
