"""The shipped demo family (examples/models) and `trtspec models train-demo --quick`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAMILY = ROOT / "examples" / "models"
SAMPLES = [
    "def f(x):\n    return x  + 1\n\n\nclass A:\n\tpass\n",
    "    if not data:  # comment with 'quotes' and \"more\"\n        raise ValueError(f'{x!r}')\n",
    "x = {'é': 'ü', '漢字': b'\\x00'}  \n\n   \n",
    "<|endoftext|>import os\r\nprint(os.sep)",
]

shipped = pytest.mark.skipif(not (FAMILY / "MANIFEST.json").is_file(), reason="demo family not trained yet")


def _manifest(root: Path) -> dict:
    """The family's manifest in the common shape (the shipped one, from before it, upgraded on read)."""
    from trtspec.artifacts import manifest

    return manifest.read(root / "MANIFEST.json", manifest.DEMO)


def _check_llama_dirs(root: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizers = {}
    for name in ("target", "draft"):
        model = AutoModelForCausalLM.from_pretrained(root / name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(root / name)
        assert model.config.vocab_size == tok.vocab_size == len(tok)
        ids = tok(SAMPLES[0], return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(ids).logits
        assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
        assert torch.isfinite(logits).all()
        for text in SAMPLES:
            assert tok.decode(tok(text).input_ids) == text
        tokenizers[name] = tok
    for fname in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert (root / "target" / fname).read_bytes() == (root / "draft" / fname).read_bytes()
    t, d = tokenizers["target"], tokenizers["draft"]
    assert t.get_vocab() == d.get_vocab()
    for text in SAMPLES:
        assert t(text).input_ids == d(text).input_ids
    assert t.eos_token == t.bos_token == t.pad_token == "<|endoftext|>"


def _check_heads(root: Path) -> None:
    from safetensors import safe_open

    target_cfg = json.loads((root / "target" / "config.json").read_text())
    H, V = target_cfg["hidden_size"], target_cfg["vocab_size"]
    kv = target_cfg["num_key_value_heads"] * (H // target_cfg["num_attention_heads"])
    F = target_cfg["intermediate_size"]

    medusa_cfg = json.loads((root / "medusa" / "config.json").read_text())
    assert medusa_cfg == {"medusa_num_heads": 4, "medusa_num_layers": 1, "hidden_size": H, "vocab_size": V,
                          "base_model_name_or_path": "../target"}
    want = {}
    for h in range(4):
        want.update({f"{h}.0.linear.weight": [H, H], f"{h}.0.linear.bias": [H], f"{h}.1.weight": [V, H]})
    with safe_open(root / "medusa" / "medusa_lm_head.safetensors", "pt") as f:
        assert {k: f.get_slice(k).get_shape() for k in f.keys()} == want
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}

    eagle_cfg = json.loads((root / "eagle" / "config.json").read_text())
    assert eagle_cfg["num_hidden_layers"] == 1 and eagle_cfg["eagle"] is True
    for key in ("hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size", "intermediate_size",
                "rms_norm_eps"):
        assert eagle_cfg[key] == target_cfg[key], key
    want = {
        "fc.weight": [H, 2 * H], "fc.bias": [H],
        "layers.0.self_attn.q_proj.weight": [H, H], "layers.0.self_attn.k_proj.weight": [kv, H],
        "layers.0.self_attn.v_proj.weight": [kv, H], "layers.0.self_attn.o_proj.weight": [H, H],
        "layers.0.mlp.gate_proj.weight": [F, H], "layers.0.mlp.up_proj.weight": [F, H],
        "layers.0.mlp.down_proj.weight": [H, F], "layers.0.post_attention_layernorm.weight": [H],
    }
    with safe_open(root / "eagle" / "model.safetensors", "pt") as f:
        assert {k: f.get_slice(k).get_shape() for k in f.keys()} == want
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F16"}


def _check_hashes(root: Path) -> None:
    from trtspec.train.demo import file_table

    assert file_table(root) == _manifest(root)["outputs"]


@shipped
def test_shipped_target_and_draft_load_with_transformers():
    _check_llama_dirs(FAMILY)


@shipped
def test_shipped_target_is_gqa_and_bigger_than_draft():
    target = json.loads((FAMILY / "target" / "config.json").read_text())
    draft = json.loads((FAMILY / "draft" / "config.json").read_text())
    assert target["num_key_value_heads"] < target["num_attention_heads"]
    assert target["architectures"] == draft["architectures"] == ["LlamaForCausalLM"]
    assert target["vocab_size"] == draft["vocab_size"]
    assert target["tie_word_embeddings"] is False
    params = _manifest(FAMILY)["models"]
    assert params["target"]["params"] >= 8 * params["draft"]["params"]


@shipped
def test_shipped_manifest_hashes_match():
    _check_hashes(FAMILY)
    manifest = _manifest(FAMILY)
    assert sum(f["bytes"] for f in manifest["outputs"].values()) <= 120 * 2**20
    assert manifest["inputs"]["corpus"]["heldout_files"]
    for name in ("target", "draft", "medusa", "eagle"):
        assert manifest["models"][name]["params"] > 0


@shipped
def test_shipped_head_layouts():
    _check_heads(FAMILY)


@shipped
def test_shipped_target_matches_the_trainers_llama():
    """The trainer's definition of the target (its Shape -> transformers Llama) and the shipped checkpoint agree."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from trtspec.train.demo import FamilyConfig
    from trtspec.train.modules import forward, llama

    cfg = json.loads((FAMILY / "target" / "config.json").read_text())
    ours = llama(FamilyConfig().target).eval()
    ours.load_state_dict({k: v.float() for k, v in load_file(FAMILY / "target" / "model.safetensors").items()})
    hf = AutoModelForCausalLM.from_pretrained(FAMILY / "target", dtype=torch.float32)
    ids = torch.arange(40)[None] * 37 % cfg["vocab_size"]
    with torch.no_grad():
        assert torch.allclose(forward(ours, ids)[0], hf(ids).logits, atol=1e-4)


@shipped
def test_heldout_prompts_are_deterministic_and_exact_length():
    from tokenizers import Tokenizer

    from trtspec.train.data import heldout_prompts

    a = heldout_prompts(4, prompt_tokens=32, seed=1)
    assert a == heldout_prompts(4, prompt_tokens=32, seed=1)
    assert len(set(a)) == 4
    tok = Tokenizer.from_file(str(FAMILY / "target" / "tokenizer.json"))
    assert all(len(tok.encode(p).ids) == 32 for p in a)


QUICK_STEPS = {"draft": 4, "medusa": 3, "eagle": 3}  # FamilyConfig.quick_config's drafter budgets


def _train_demo(*args: str):
    from click.testing import CliRunner

    from trtspec.cli import main

    return CliRunner().invoke(main, ["models", "train-demo", "--quick", *args])


@pytest.fixture(scope="module")
def quick_family(tmp_path_factory):
    """`train-demo --quick` once for the module (~3 s on 2 idle cores): tokenizer, target, three drafters."""
    root = tmp_path_factory.mktemp("quick")
    result = _train_demo("--out", str(root / "family"), "--seed", "3")
    assert result.exit_code == 0, result.output
    return root / "family"


@pytest.mark.timeout(60)
def test_train_demo_quick_produces_a_loadable_family(quick_family):
    out = quick_family
    _check_llama_dirs(out)
    _check_heads(out)
    _check_hashes(out)
    manifest = _manifest(out)
    assert manifest["seed"] == 3 and manifest["config"]["quick"] is True
    assert set(manifest["models"]["draft"]["acceptance"]) == {"2", "4", "8"}
    assert not [p for p in out.parent.iterdir() if p.name != "family"]  # no temp dir left behind
    assert not [p for p in out.rglob("*") if p.name.startswith(".")]  # nor the drafters' work dir

    again = _train_demo("--out", str(out))
    assert again.exit_code == 3 and "not empty" in again.output


def test_train_demo_drafters_are_trained_by_trtspec_train(quick_family):
    """The three drafters come from trtspec.train.drafters (its record per member, in the family's MANIFEST,
    not as a trtspec.train.json of their own: the layout is the family's), on the whole vocabulary."""
    models = _manifest(quick_family)["models"]
    for name, kind in {"draft": "draft-model", "medusa": "medusa", "eagle": "eagle"}.items():
        trainer = models[name]["trainer"]
        assert trainer["created_by"] == f"trtspec train {kind}" and trainer["method"] == kind
        assert trainer["budget"]["steps_done"] == QUICK_STEPS[name] == trainer["recipe"]["steps"]
        assert trainer["recipe"]["seed"] == 3 and trainer["inputs"]["data"]["mode"] == "text"
        assert trainer["draft_vocab_size"] == 2048 == trainer["inputs"]["target"]["vocab_size"]
        assert trainer["inputs"]["data"]["samples"] == 16  # quick --teacher-seqs
        assert models[name]["params"] == trainer["params"] > 0
    assert models["draft"]["loss"]["heldout"] > 0
    assert not list(quick_family.rglob("trtspec.train.json"))


@pytest.mark.parametrize("method", ["draft-model", "medusa", "eagle"])
def test_train_demo_family_serves_each_drafter_greedy_identically(quick_family, method):
    """Each drafter loads through its method in the runtime and speculates (chain and, for heads, a tree)
    to exactly the runtime's plain greedy output; row-exact passes, so that no near-tie of the barely
    trained quick target can flip a token."""
    from trtspec import methods
    from trtspec.artifacts.tokenizer import load_tokenizer
    from trtspec.check import spec_from_dict
    from trtspec.runtime import SamplingParams

    where = {"draft-model": {"draft": "draft"}, "medusa": {"heads": "medusa"}, "eagle": {"heads": "eagle"}}[method]
    tree = {"choices": [[0], [1], [0, 0], [0, 1], [0, 0, 0]]} if method != "draft-model" else {}
    spec = spec_from_dict({
        "schema": 1, "model": {"name": "quick", "target": "target", "dtype": "float32"},
        "speculative": {"method": method, "num_draft_tokens": 5 if tree else 4, **where, **tree},
        "limits": {"max_batch_size": 2, "max_input_len": 32, "max_output_len": 12},
        "runtime": {"kind": "torch", "device": "cpu", "torch": {"row_exact": True}}}, base=quick_family)
    tok = load_tokenizer(quick_family / "target")
    prompts = [tok(text, add_special_tokens=False)["input_ids"][:32] for text in SAMPLES[:2]]
    engine = methods.engine(spec, tokenizer=tok)
    try:
        plain = [engine.generate(p, SamplingParams(max_new_tokens=12, end_id=-1, num_draft_tokens=0)).tokens
                 for p in prompts]
        sp = SamplingParams(max_new_tokens=12, end_id=-1, num_draft_tokens=engine.k_max)
        spec_out = [engine.generate(p, sp) for p in prompts]
        batch = engine.generate_batch(prompts, [sp, sp])
    finally:
        engine.close()
    assert [r.tokens for r in spec_out] == plain == [r.tokens for r in batch]
    assert all(len(t) == 12 for t in plain) and sum(r.drafted for r in spec_out) > 0


def test_train_demo_target_trains_only_the_drafters_against_a_copied_target(quick_family, tmp_path):
    """`--target DIR`: the target is copied byte for byte (its MANIFEST entry taken over from its family's),
    the drafters are trained again against it, and the new family is complete."""
    out = tmp_path / "drafters"
    result = _train_demo("--target", str(quick_family / "target"), "--out", str(out), "--seed", "3",
                         "--draft-steps", "2")
    assert result.exit_code == 0, result.output
    for f in (quick_family / "target").iterdir():
        assert (out / "target" / f.name).read_bytes() == f.read_bytes()
    _check_heads(out)
    _check_hashes(out)
    old, new = _manifest(quick_family), _manifest(out)
    assert new["models"]["target"]["train"] == old["models"]["target"]["train"]
    assert new["models"]["target"]["loss"] == old["models"]["target"]["loss"]
    assert new["inputs"]["target"] == {"path": str((quick_family / "target").resolve()),
                                       "family_manifest_matches": True}
    assert new["models"]["draft"]["trainer"]["budget"]["steps_done"] == 2
    assert new["created_by"] == "trtspec models train-demo --quick --target"
    assert ((out / "draft" / "model.safetensors").read_bytes()
            != (quick_family / "draft" / "model.safetensors").read_bytes())


def test_train_demo_target_refuses_a_dir_that_is_no_family_target_and_target_steps(quick_family, tmp_path):
    (tmp_path / "empty").mkdir()
    bad = _train_demo("--target", str(tmp_path / "empty"), "--out", str(tmp_path / "out"))
    assert bad.exit_code == 3 and "not a demo-family target" in bad.output and not (tmp_path / "out").exists()
    both = _train_demo("--target", str(quick_family / "target"), "--target-steps", "3", "--out", str(tmp_path / "o"))
    assert both.exit_code == 64 and "--target-steps" in both.output


def test_heldout_prompts_without_a_family_is_a_model_error(tmp_path):
    from trtspec.errors import ModelError
    from trtspec.train.data import heldout_prompts

    with pytest.raises(ModelError):
        heldout_prompts(2, models_dir=tmp_path)


def test_family_table_leaves_out_an_artifact_with_its_own_manifest(tmp_path):
    """`make smollm2` imports beside the family (examples/models/smollm2-*/trtspec.import.json): not a member."""
    from trtspec.train.demo import file_table

    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text("{}")
    (tmp_path / "imported").mkdir()
    (tmp_path / "imported" / "config.json").write_text("{}")
    (tmp_path / "imported" / "trtspec.import.json").write_text("{}")
    assert sorted(file_table(tmp_path)) == ["target/config.json"]
