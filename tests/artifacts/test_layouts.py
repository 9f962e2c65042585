"""Weights, head layouts and manifests: one reader and one writer each, one error behaviour wherever they are
read (check, convert, the memory plan, the runtime, the llmapi renderer), old manifests read tolerantly."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.runtime import family
from tests.trtllm import fixtures as fx
from trtspec import methods
from trtspec.artifacts import heads, manifest
from trtspec.artifacts.hf import ModelConfig
from trtspec.artifacts.weights import load_weights, weight_shapes
from trtspec.check import spec_from_dict
from trtspec.errors import ConvertError, ModelError, RepositoryError


@pytest.fixture(scope="module")
def fam(tmp_path_factory) -> Path:
    return family.build_family(tmp_path_factory.mktemp("layouts"))


def _copy(fam: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(fam, tmp_path / "fam"))


def _spec(root: Path, method: str, **speculative):
    s = {"method": method, "num_draft_tokens": 3, **speculative}
    return spec_from_dict({"schema": 1, "model": {"name": f"t-{method}", "target": "target", "dtype": "float32"},
                           "speculative": s, "limits": {"max_batch_size": 1, "max_input_len": 16,
                                                        "max_output_len": 8}}, base=root)


# ----------------------------------------------------------------------------------------------- weights


def test_sharded_and_single_file_weights_load_alike_and_size_from_headers(fam, tmp_path):
    from safetensors.torch import save_file

    whole = load_weights(fam / "target")
    shards = tmp_path / "sharded"
    shards.mkdir()
    names = sorted(whole)
    half = len(names) // 2
    parts = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for file, keys in parts.items():
        save_file({k: whole[k] for k in keys}, str(shards / file))
    index = {"weight_map": {k: f for f, keys in parts.items() for k in keys}}
    (shards / "model.safetensors.index.json").write_text(json.dumps(index))
    again = load_weights(shards)
    assert set(again) == set(whole) and all(torch.equal(again[k], whole[k]) for k in whole)
    shapes = weight_shapes(shards)
    assert {k: s for k, (_, s) in shapes.items()} == {k: list(v.shape) for k, v in whole.items()}
    (shards / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ConvertError, match="lists model-00002-of-00002.safetensors, which is missing"):
        load_weights(shards, error=ConvertError)


def test_the_converter_refuses_pickled_weights_without_unpickling_them(tmp_path):
    """One loader for every reader: .bin-only checkpoints are refused (the converter used to torch.load them)."""
    from trtspec.convert import ConvertJob, run_job

    src = fx.make_llama(tmp_path / "m")
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")  # never unpickled
    with pytest.raises(ConvertError, match="only PyTorch .bin weights found"):
        run_job(ConvertJob("target", "llama", src, None, tmp_path / "ckpt"))


# -------------------------------------------------------------------------------------------------- Medusa


@pytest.mark.parametrize("value", [None, 0, "4", True])
def test_medusa_num_heads_has_one_error_behaviour_everywhere(fam, tmp_path, value):
    """Missing or not an integer >= 1: an error naming the key in check, convert, the memory plan and the
    runtime alike (the memory plan used to assume one head, the converter 0 heads, the runtime int("4"))."""
    from trtspec.backends.trtllm_engine_methods import engine_method, medusa_num_heads
    from trtspec.builders.trtllm.memory import memory_plan
    from trtspec.methods import check_pair

    root = _copy(fam, tmp_path)
    cfg = json.loads((root / "medusa" / "config.json").read_text())
    cfg.pop("medusa_num_heads") if value is None else cfg.update(medusa_num_heads=value)
    (root / "medusa" / "config.json").write_text(json.dumps(cfg))
    spec = _spec(root, "medusa", heads="medusa")
    assert any("medusa_num_heads" in str(p) for p in check_pair(spec).problems)
    with pytest.raises(ConvertError, match="medusa_num_heads"):
        medusa_num_heads(spec)
    trtllm = spec.model_copy(update={"runtime": spec.runtime.model_copy(update={"kind": "trtllm-engine"})})
    assert any("medusa_num_heads" in p for p in memory_plan(trtllm, engine_method(trtllm)).problems)
    with pytest.raises(ModelError, match="medusa_num_heads"):
        methods.engine(spec)


def test_medusa_writer_and_reader_round_trip_and_refuse_a_wrong_layout(tmp_path):
    t = {f"{h}.0.linear.weight": torch.ones(4, 4) * h for h in range(2)}
    t |= ({f"{h}.0.linear.bias": torch.zeros(4) for h in range(2)}
          | {f"{h}.1.weight": torch.ones(7, 4) for h in range(2)})
    heads.write_medusa(tmp_path / "m", t, hidden_size=4, vocab_size=7)
    cfg, back = heads.load_medusa(tmp_path / "m")
    assert (cfg.num_heads, cfg.num_layers, cfg.hidden_size, cfg.vocab_size) == (2, 1, 4, 7)
    assert all(torch.equal(back[k], t[k]) for k in t)
    with pytest.raises(ValueError, match="not the layout"):
        heads.write_medusa(tmp_path / "bad", {"0.0.linear.weight": torch.ones(4, 4)}, hidden_size=4, vocab_size=7)


# --------------------------------------------------------------------------------------------------- EAGLE


def test_eagle_heads_must_fit_the_target_already_at_check_time(fam, tmp_path):
    """`check` compares what the runtime compares (hidden, heads, KV heads, head_dim, vocab): a head with other
    attention heads used to pass `check` and fail when the server loaded it."""
    from trtspec.methods import check_pair

    root = _copy(fam, tmp_path)
    cfg = json.loads((root / "eagle" / "config.json").read_text())
    cfg.update(num_attention_heads=2, num_key_value_heads=1, head_dim=32)  # the same q/k/v sizes, other heads
    (root / "eagle" / "config.json").write_text(json.dumps(cfg))
    problems = [str(p) for p in check_pair(_spec(root, "eagle", heads="eagle")).problems]
    assert any("num_attention_heads 2 differs from the target's 4" in p for p in problems), problems
    with pytest.raises(ModelError, match="num_attention_heads 2 differs"):
        heads.load_eagle(root / "eagle", ModelConfig.from_dir(root / "target"))


def test_an_eagle_head_config_inherits_the_targets_keys_in_the_runtime_too(fam, tmp_path):
    """EAGLE-1 head configs may record only what differs from the target: the converter always merged them over
    the target's config; the runtime now reads them the same way (it used to refuse a missing key)."""
    from trtspec.runtime import SamplingParams

    root = _copy(fam, tmp_path)
    (root / "eagle" / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 1}))
    eng = methods.engine(_spec(root, "eagle", heads="eagle"))
    assert len(eng.generate([1, 2, 3], SamplingParams(max_new_tokens=4)).tokens) == 4


def test_the_converter_reads_model_prefixed_eagle_weights_like_the_runtime(tmp_path):
    from safetensors.torch import load_file, save_file

    from trtspec.convert import ConvertJob, read_checkpoint, run_job

    models = tmp_path / "models"
    fx.make_llama(models / "target")
    fx.make_eagle(models / "eagle")
    plain = load_file(str(models / "eagle" / "model.safetensors"))
    save_file({f"model.{k}": v for k, v in plain.items()}, str(models / "eagle" / "model.safetensors"))
    run_job(ConvertJob("target", "eagle", models / "target", models / "eagle", tmp_path / "ckpt", 1, 1, "float32",
                       max_draft_len=4, num_eagle_layers=4, max_non_leaves_per_layer=1))
    back = read_checkpoint(tmp_path / "ckpt").eagle
    assert set(back) == set(plain) and all(torch.equal(back[k], plain[k]) for k in plain)


def test_eagle_version_of_a_damaged_head_is_a_repository_error(fam, tmp_path):
    """The llmapi renderer's EAGLE-3 probe used to crash (struct.error) on a truncated safetensors file."""
    from trtspec.backends.trtllm_llmapi_methods import eagle_version

    root = _copy(fam, tmp_path)
    assert eagle_version(root / "eagle") == 1
    (root / "eagle" / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(RepositoryError, match="not a readable safetensors file"):
        eagle_version(root / "eagle")


def test_the_trainers_eagle_head_is_what_the_runtime_computes(tmp_path):
    """The layout's equations (artifacts/heads.py) on both sides: the trainer's module (transformers'
    decoder layer) and the runtime's Llama reading the written head."""
    from trtspec.runtime.cache import chain_inputs
    from trtspec.runtime.llama import Llama
    from trtspec.train.modules import EagleHead, Shape
    from trtspec.train.writers import write_eagle1

    torch.manual_seed(0)
    shape = Shape(n_layer=1, dim=64, n_head=4, n_kv_head=2, ffn=128, vocab=50, max_pos=64)
    head = EagleHead(shape.model_config("float16")).eval()  # as `trtspec train eagle` builds it
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.2)
        head.layers[0].post_attention_layernorm.weight.uniform_(0.5, 1.5)
        for p in head.parameters():  # what is written: float16 (the rope buffers stay float32)
            p.copy_(p.half().float())
    write_eagle1(tmp_path / "eagle", head, shape.model_config("float16"), "../target")
    target = ModelConfig.from_dict({**shape.hf_config().to_dict(), "num_hidden_layers": 2})
    cfg, w = heads.load_eagle(tmp_path / "eagle", target)
    net = Llama(cfg, {k: v.float() for k, v in w.items()}, prefix="", input_norm=False, final_norm=False,
                embed=torch.zeros(50, 64), lm_head=torch.zeros(50, 64), max_seq=64)
    emb, feats = torch.randn(1, 9, 64), torch.randn(1, 9, 64)
    with torch.no_grad():
        want = head(emb, feats)
        inp = chain_inputs([0], 9)
        x = torch.cat([emb, feats], -1) @ w["fc.weight"].float().T + w["fc.bias"].float()
        got = net.hidden(x, net.new_cache(1), inp.positions, inp.start, inp.mask)
    assert (got - want).abs().max().item() < 1e-4


# ------------------------------------------------------------------------------------------------ manifests


def test_old_manifests_are_read_tolerantly(tmp_path):
    (tmp_path / "a.json").write_bytes(b"\xff\xfe not utf-8")
    assert manifest.read(tmp_path / "a.json") is None  # the build lock reader used to raise UnicodeDecodeError
    assert manifest.read(tmp_path / "missing.json") is None
    new = manifest.new(manifest.CONVERT, 1, inputs={}, outputs={})
    manifest.write(tmp_path / "b.json", new)
    assert manifest.read(tmp_path / "b.json", manifest.CONVERT) == new
    assert manifest.read(tmp_path / "b.json", manifest.LOCK) is None
    old_demo = {"format": 1, "created_by": "trtspec models train-demo", "corpus": {"heldout_files": ["x.py"]},
                "files": {"t/a": {"sha256": "0", "bytes": 1}}, "models": {}}
    (tmp_path / "MANIFEST.json").write_text(json.dumps(old_demo))
    up = manifest.read(tmp_path / "MANIFEST.json", manifest.DEMO)
    assert up["kind"] == manifest.DEMO and up["outputs"] == old_demo["files"]
    assert up["inputs"]["corpus"]["heldout_files"] == ["x.py"] and up["models"] == {}


def test_a_conversion_recorded_in_the_old_manifest_shape_is_redone(tmp_path):
    from trtspec.convert import ConvertJob, run_job
    from trtspec.convert.checkpoint import MANIFEST

    src = fx.make_llama(tmp_path / "m")
    job = ConvertJob("target", "llama", src, None, tmp_path / "ckpt", 1, 1, "float32")
    first = run_job(job)
    assert first.converted and not run_job(job).converted
    recorded = json.loads((tmp_path / "ckpt" / MANIFEST).read_text())
    assert recorded["kind"] == "convert" and recorded["outputs"]["files"] == ["rank0.safetensors"]
    old = {"fingerprint": first.fingerprint, "files": ["rank0.safetensors"], "sources": recorded["inputs"]["files"]}
    (tmp_path / "ckpt" / MANIFEST).write_text(json.dumps(old))
    assert run_job(job).converted
