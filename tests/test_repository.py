"""The torch-flavour Triton repository: emitted configs (parsed back through protobuf), the exact
streaming detokenization, request checks, and `trtspec build` (lock, skip, atomicity)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from tests.runtime.family import build_family, write_spec
from trtspec.backends import build
from trtspec.builders import BuildOptions
from trtspec.builders.lock import LOCK_NAME, read_lock
from trtspec.check import load_spec, spec_from_dict
from trtspec.errors import BuildError, ClientError
from trtspec.repository import pbtxt, serving, textio
from trtspec.repository.torch_repo import (
    ENSEMBLE_INPUTS,
    ENSEMBLE_OUTPUTS,
    ModelNames,
    emit_torch_repository,
    model_source,
)

METHODS = ["draft-model", "medusa", "eagle", "lookahead"]


# --------------------------------------------------------------------------------------------
# Streaming detokenization
# --------------------------------------------------------------------------------------------


class ByteTokenizer:
    """One token per byte, decoded like HF (incomplete or invalid UTF-8 -> U+FFFD); id 256 is special."""

    def __len__(self):
        return 257

    def decode(self, ids, skip_special_tokens=True):
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def batch_decode(self, seqs, skip_special_tokens=True):
        return [self.decode(s) for s in seqs]


def _stream(tok, ids, rng, boundary):
    """Send `ids` in random chunks through ContextTracker + text_delta; return the pieces."""
    tracker, pieces, i = textio.ContextTracker(boundary), [], 0
    while i < len(ids):
        n = rng.randint(1, 4)
        context, delta = tracker.push(ids[i:i + n])
        i += n
        pieces.append(textio.text_delta(tok, context, delta, final=i >= len(ids)))
    return pieces


@pytest.mark.parametrize("seed", range(20))
def test_streamed_bytes_reassemble_exactly(seed):
    tok, rng = ByteTokenizer(), random.Random(seed)
    boundary = textio.boundary_tokens(tok)
    text = "".join(rng.choice(["a", " ", "é", "→", "😀", "你", "\n"]) for _ in range(40))
    data = list(text.encode())
    if seed % 2:  # invalid bytes too: lone continuation bytes, truncated sequences, a special token
        for _ in range(6):
            data.insert(rng.randrange(len(data) + 1), rng.choice([0x80, 0xBF, 0xE4, 0xF0, 256]))
    pieces = _stream(tok, data, rng, boundary)
    assert "".join(pieces) == tok.decode(data)
    if seed % 2 == 0:  # valid text: a piece never shows a partial character
        assert all("\ufffd" not in p for p in pieces)


def test_context_stays_short():
    tok = ByteTokenizer()
    tracker = textio.ContextTracker(textio.boundary_tokens(tok))
    ids = list(("ab→c" * 50).encode())
    contexts = [len(tracker.push(ids[i:i + 2])[0]) for i in range(0, len(ids), 2)]
    assert max(contexts) <= 4


@pytest.mark.parametrize("seed", range(12))
def test_streaming_with_stop_strings_equals_the_engines_trimmed_text(seed):
    """The engine stops at the token that completes a stop string and trims the text at its start;
    the streamed pieces (whole-output context, partial stop strings held back) must add up to that."""
    tok, rng = ByteTokenizer(), random.Random(seed)
    stop = ["\n\n", "end→", "ab"][seed % 3:] + (["zz"] if seed % 2 else [])
    text = "".join(rng.choice(["a", "b", "\n", "e", "n", "d", "→", " "]) for _ in range(60))
    data = list(text.encode())
    ids, reason = [], "length"  # run "the engine": stop at the first token that completes a stop string
    for t in data:
        ids.append(t)
        if any(s in tok.decode(ids) for s in stop):
            reason = "stop"
            break
    full = tok.decode(ids)
    cut = min((full.find(s) for s in stop if s in full), default=len(full))
    tracker, pieces, i = textio.ContextTracker(None), [], 0
    while i < len(ids):
        n = rng.randint(1, 3)
        context, delta = tracker.push(ids[i:i + n])
        i += n
        final = i >= len(ids)
        trim = len(full) - cut if final and reason == "stop" else 0
        pieces.append(textio.text_delta(tok, context, delta, final, trim, stop))
    assert "".join(pieces) == full[:cut]


def test_stop_trim_on_the_final_response():
    tok = ByteTokenizer()
    ids = list("hello world".encode())
    assert textio.text_delta(tok, ids[:5], ids[5:], final=True, trim=len("world")) == " "
    assert textio.text_delta(tok, ids[:8], ids[8:], final=True, trim=len("world")) == ""


def test_byte_level_bpe_stream_matches_full_decode():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["naïve café → déjà vu 😀 你好世界 " * 3, "def f(x):\n    return x  # ✓\n" * 3]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")
    boundary = textio.boundary_tokens(tok)
    text = "x → 😀😀 你好 é"
    ids = tok.encode(text) + [tok.eos_token_id]
    assert any(len(tok.decode([i])) and "\ufffd" in tok.decode([i]) for i in ids)  # really split characters
    for seed in range(10):
        pieces = _stream(tok, ids, random.Random(seed), boundary)
        assert "".join(pieces) == text
        assert all("\ufffd" not in p for p in pieces)


# --------------------------------------------------------------------------------------------
# Request checks and engine-dir resolution
# --------------------------------------------------------------------------------------------


def test_request_checks():
    with pytest.raises(serving.RequestError, match="empty"):
        serving.check_lengths(0, 5, 10, 10)
    with pytest.raises(serving.RequestError, match="max_input_len"):
        serving.check_lengths(11, 5, 10, 10)
    with pytest.raises(serving.RequestError, match="> 0"):
        serving.check_lengths(3, 0, 10, 10)
    with pytest.raises(serving.RequestError, match="max_output_len"):
        serving.check_lengths(3, 11, 10, 10)
    serving.check_lengths(10, 10, 10, 10)
    with pytest.raises(serving.RequestError, match="'bogus'"):
        serving.check_parameters('{"bogus": 1}', {"text_input"})
    serving.check_parameters({"triton_enable_empty_final_response": True}, {"text_input"})


def test_engine_dir_is_relative_to_the_repository_root_and_env_overrides(tmp_path, monkeypatch):
    (tmp_path / "engines" / "m").mkdir(parents=True)
    model_dir = tmp_path / "repo" / "m" / "tensorrt_llm"
    model_dir.mkdir(parents=True)
    params = {"engine_dir": "../../engines/m"}
    monkeypatch.delenv(serving.ENGINE_DIR_ENV, raising=False)
    assert serving.resolve_engine_dir(model_dir, params) == (tmp_path / "engines" / "m").resolve()
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.setenv(serving.ENGINE_DIR_ENV, str(other))
    assert serving.resolve_engine_dir(model_dir, params) == other.resolve()


# --------------------------------------------------------------------------------------------
# The emitted repository
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    return build_family(tmp_path_factory.mktemp("family"))


def _emit(family, method, tmp_path, **extra):
    spec = load_spec(write_spec(family, method, k=3 if method == "medusa" else 4))
    if extra:
        data = spec.to_dict()
        for section, values in extra.items():
            data[section].update(values)
        spec = spec_from_dict(data, source=spec.source)
    engine_dir = tmp_path / "engines" / spec.name
    engine_dir.mkdir(parents=True)
    repo = emit_torch_repository(spec, tmp_path / "repo" / spec.name, engine_dir)
    return spec, repo


@pytest.mark.parametrize("method", METHODS)
def test_every_config_parses_and_the_ensemble_is_wired(family, tmp_path, method):
    spec, repo = _emit(family, method, tmp_path)
    configs = {p.parent.name: pbtxt.read_config(p) for p in repo.root.glob("*/config.pbtxt")}
    assert set(configs) == {"preprocessing", "tensorrt_llm", "postprocessing", "ensemble"}
    for name, cfg in configs.items():
        assert cfg.name == name
        assert (repo.root / name / "1").is_dir()
        assert cfg.max_batch_size == spec.limits.max_batch_size
    for role, name in [("preprocessing", "preprocessing"), ("generation", "tensorrt_llm"),
                       ("postprocessing", "postprocessing")]:
        assert (repo.root / name / "1" / "model.py").read_bytes() == model_source(role)
        assert configs[name].backend == "python"
        param = configs[name].parameters["engine_dir"].string_value
        assert param == "../../engines/" + spec.name  # relative to the repository root
    gen = configs["tensorrt_llm"]
    assert gen.model_transaction_policy.decoupled
    assert gen.instance_group[0].kind == pbtxt.mc.ModelInstanceGroup.KIND_CPU
    assert gen.parameters["decoding_mode"].string_value == method

    ens = configs["ensemble"]
    assert ens.platform == "ensemble"
    inputs = {t.name: t for t in ens.input}
    assert [t["name"] for t in ENSEMBLE_INPUTS] == list(inputs)
    # all optional in the config, text_input and max_tokens too: preprocessing, which every input reaches,
    # refuses a request without them (Triton 2.51 would answer it with an empty success)
    assert all(t.optional for t in inputs.values())
    assert inputs["text_input"].data_type == pbtxt.mc.TYPE_STRING
    assert inputs["seed"].data_type == pbtxt.mc.TYPE_UINT64
    assert inputs["stream"].data_type == pbtxt.mc.TYPE_BOOL
    # every step input comes from an ensemble input or an earlier step's output, with matching types
    available = {t.name: t.data_type for t in ens.input}
    for step in ens.ensemble_scheduling.step:
        model = configs[step.model_name]
        model_inputs = {t.name: t for t in model.input}
        for inner, outer in step.input_map.items():
            assert outer in available, (step.model_name, outer)
            assert available[outer] == model_inputs[inner].data_type
        missing = [t.name for t in model.input if not t.optional and t.name not in step.input_map]
        assert not missing, (step.model_name, missing)
        model_outputs = {t.name: t.data_type for t in model.output}
        for inner, outer in step.output_map.items():
            available[outer] = model_outputs[inner]
    for out in ENSEMBLE_OUTPUTS:
        assert out["name"] in available


def test_cuda_spec_uses_gpu_instances(family, tmp_path):
    _, repo = _emit(family, "eagle", tmp_path, runtime={"device": "cuda"}, gpu={"type": "h100"})
    gen = pbtxt.read_config(repo.root / "tensorrt_llm" / "config.pbtxt")
    assert gen.instance_group[0].kind == pbtxt.mc.ModelInstanceGroup.KIND_GPU
    pre = pbtxt.read_config(repo.root / "preprocessing" / "config.pbtxt")
    assert pre.instance_group[0].kind == pbtxt.mc.ModelInstanceGroup.KIND_CPU


def test_several_deployments_share_one_repository(family, tmp_path):
    root = tmp_path / "shared"
    for method in ("eagle", "lookahead"):
        spec = load_spec(write_spec(family, method))
        names = ModelNames(generation=f"tensorrt_llm_{method}", ensemble=f"ensemble_{method}")
        emit_torch_repository(spec, root, tmp_path / "engines" / spec.name, names=names)
    assert sorted(p.name for p in root.iterdir()) == [
        "ensemble_eagle", "ensemble_lookahead", "postprocessing", "preprocessing", "tensorrt_llm_eagle",
        "tensorrt_llm_lookahead"]
    ens = pbtxt.read_config(root / "ensemble_eagle" / "config.pbtxt")
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["preprocessing", "tensorrt_llm_eagle",
                                                                    "postprocessing"]


# --------------------------------------------------------------------------------------------
# trtspec build (torch)
# --------------------------------------------------------------------------------------------


def test_build_writes_engines_lock_and_repository_then_skips(family, tmp_path):
    spec = load_spec(write_spec(family, "draft-model"))
    options = BuildOptions(out_engines=tmp_path / "engines", out_repo=tmp_path / "model_repository")
    first = build(spec, options)
    assert sorted(first.rebuilt) == ["draft", "target"] and first.skipped == []
    engine = Path(first.engines["target"]).parent
    for role in ("target", "draft"):
        assert (engine / role / "model.safetensors").is_file()
        assert json.loads((engine / role / "config.json").read_text())["torch_dtype"] == "float32"
    assert (engine / "target" / "tokenizer.json").is_file()
    lock = read_lock(engine)
    assert set(lock["inputs"]) == {"target", "draft", "tokenizer"}
    assert lock["inputs"]["target"]["files"]["model.safetensors"]
    assert {"trtspec", "torch", "transformers"} <= set(lock["versions"])
    assert lock["spec"]["model"]["name"] == spec.name
    served = spec_from_dict(json.loads((engine / "spec.json").read_text()), base=engine)
    assert served.model.target == engine / "target" and served.speculative.draft == engine / "draft"
    assert first.to_dict()["repository"] == str(tmp_path / "model_repository" / spec.name)
    text = (tmp_path / "model_repository" / spec.name / "tensorrt_llm" / "config.pbtxt").read_text()
    assert str(tmp_path) not in text  # no absolute build-machine paths in the repository

    again = build(spec, options)
    assert again.rebuilt == [] and sorted(again.skipped) == ["draft", "target"]
    forced = build(spec, BuildOptions(out_engines=options.out_engines, out_repo=options.out_repo, force=True))
    assert sorted(forced.rebuilt) == ["draft", "target"]


def test_changed_input_rebuilds_and_failed_build_keeps_old_outputs(family, tmp_path):
    fam = tmp_path / "fam"
    shutil.copytree(family, fam)
    spec = load_spec(write_spec(fam, "eagle"))
    options = BuildOptions(out_engines=tmp_path / "engines", out_repo=tmp_path / "model_repository")
    build(spec, options)
    engine = tmp_path / "engines" / spec.name
    old_lock = (engine / LOCK_NAME).read_text()

    cfg = json.loads((fam / "eagle" / "config.json").read_text())
    cfg["note"] = "changed"
    (fam / "eagle" / "config.json").write_text(json.dumps(cfg))
    assert build(spec, options).rebuilt  # a changed input is noticed
    new_lock = (engine / LOCK_NAME).read_text()
    assert new_lock != old_lock

    # a truncated weight file: its header (what `check` reads) is intact, loading its tensors fails mid-build
    weights = fam / "eagle" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    with pytest.raises(BuildError, match="safetensors"):
        build(spec, options)
    assert (engine / LOCK_NAME).read_text() == new_lock  # the previous build is untouched
    assert (tmp_path / "model_repository" / spec.name / "ensemble" / "config.pbtxt").is_file()
    assert not [p for p in (tmp_path / "engines").iterdir() if p.name.startswith(".")]


def test_build_cli_json(family, tmp_path):
    from click.testing import CliRunner

    from trtspec.cli import main

    spec_path = write_spec(family, "lookahead")
    args = ["build", "-c", str(spec_path), "--out-engines", str(tmp_path / "e"), "--out-repo", str(tmp_path / "r"),
            "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["runtime"] == "torch" and data["rebuilt"] == ["target"]
    again = CliRunner().invoke(main, args[:-1])
    assert "nothing to rebuild" in again.output


# --------------------------------------------------------------------------------------------
# Client errors without a server
# --------------------------------------------------------------------------------------------


def test_client_connection_refused_is_one_clear_line():
    from trtspec.client import generate_remote
    from trtspec.serve.endpoints import free_port

    with pytest.raises(ClientError, match="cannot reach Triton") as info:
        generate_remote(f"localhost:{free_port()}", "hi", max_tokens=4, timeout=5)
    assert "\n" not in info.value.message


def test_client_url_forms():
    from trtspec.client import normalize_url

    assert normalize_url("grpc://h:1/") == "h:1"
    assert normalize_url(":8001") == "localhost:8001"
    with pytest.raises(ClientError):
        normalize_url("nohostport")
