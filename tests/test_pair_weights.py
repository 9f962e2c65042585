"""A config.json that disagrees with its weights (vocab, layers, heads) is a model problem found by `check`
and `build` from the safetensors headers (exit 3), not a failure when the server loads the model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.runtime.family import build_family, write_spec
from trtspec.backends import build
from trtspec.builders import BuildOptions
from trtspec.check import load_spec
from trtspec.cli import main
from trtspec.errors import PairError
from trtspec.methods import check_pair


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return build_family(tmp_path_factory.mktemp("family"))


@pytest.fixture
def family(pristine, tmp_path):
    """A private copy whose configs a test may edit."""
    return Path(shutil.copytree(pristine, tmp_path / "family"))


def _edit(path: Path, **changes) -> None:
    cfg = json.loads(path.read_text())
    cfg.update(changes)
    path.write_text(json.dumps(cfg))


def _problems(family: Path, method: str) -> list[str]:
    return [str(p) for p in check_pair(load_spec(write_spec(family, method, k=3 if method == "medusa" else 4)))
            .problems]


def test_the_tiny_family_fits_its_configs(family):
    for method in ("draft-model", "medusa", "eagle", "lookahead"):
        assert _problems(family, method) == [], method


@pytest.mark.parametrize("role,method,key,change,evidence", [
    ("target", "lookahead", "model.target", {"vocab_size": 97}, "model.embed_tokens.weight in model.safetensors"),
    ("target", "lookahead", "model.target", {"num_hidden_layers": 3}, "2 decoder layer(s)"),
    ("target", "lookahead", "model.target", {"num_hidden_layers": 1}, "2 decoder layer(s)"),
    ("target", "lookahead", "model.target", {"num_attention_heads": 8}, "q_proj.weight in model.safetensors"),
    ("target", "lookahead", "model.target", {"num_key_value_heads": 4}, "k_proj.weight in model.safetensors"),
    ("draft", "draft-model", "speculative.draft", {"num_hidden_layers": 2}, "1 decoder layer(s)"),
    ("medusa", "medusa", "speculative.heads", {"medusa_num_heads": 4}, "medusa_lm_head.safetensors holds 3"),
    ("eagle", "eagle", "speculative.heads", {"num_hidden_layers": 2}, "1 decoder layer(s)"),
])
def test_each_mismatch_is_one_problem_naming_the_file_and_key(family, role, method, key, change, evidence):
    _edit(family / role / "config.json", **change)
    (config_key,) = change
    mine = [p for p in _problems(family, method) if "disagrees with the weights" in p]
    assert len(mine) == 1, mine
    assert mine[0].startswith(key) and f"config.json {config_key} = {change[config_key]}" in mine[0]
    assert evidence in mine[0]


def test_check_and_build_exit_3(family, tmp_path):
    _edit(family / "target" / "config.json", vocab_size=97)
    spec_path = write_spec(family, "lookahead")
    result = CliRunner().invoke(main, ["check", "-c", str(spec_path)])
    assert result.exit_code == 3, result.output
    assert "error: model.target" in result.output and "vocab_size = 97" in result.output
    out = ["--out-engines", str(tmp_path / "e"), "--out-repo", str(tmp_path / "r")]
    result = CliRunner().invoke(main, ["build", "-c", str(spec_path), *out])
    assert result.exit_code == 3, result.output
    with pytest.raises(PairError, match="vocab_size"):
        build(load_spec(spec_path), BuildOptions(out_engines=tmp_path / "e", out_repo=tmp_path / "r", progress=False))
    assert not (tmp_path / "e").exists() or not any((tmp_path / "e").iterdir())


def test_sharded_and_unreadable_weights(family):
    target = family / "target"
    (target / "model.safetensors").rename(target / "model-00001-of-00002.safetensors")
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = {"weight_map": {"model.embed_tokens.weight": shards[0], "lm_head.weight": shards[1]}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    assert any("model-00002-of-00002.safetensors, which is missing" in p for p in _problems(family, "lookahead"))
    (target / "model.safetensors.index.json").unlink()
    (target / "model-00001-of-00002.safetensors").rename(target / "model.safetensors")
    assert _problems(family, "lookahead") == []
    (target / "model.safetensors").write_bytes(b"\xff" * 16)  # a header length far past the end of the file
    problems = _problems(family, "lookahead")
    assert len(problems) == 1 and "not a readable safetensors file" in problems[0]


def test_check_shows_a_broken_files_own_hint(family):
    """A config.json that is not JSON is a model problem whose hint says what to do with the file, not the
    generic 'fix the keys named above'."""
    (family / "target" / "config.json").write_text("{not json")
    spec_path = write_spec(family, "draft-model")
    result = CliRunner().invoke(main, ["check", "-c", str(spec_path)])
    assert result.exit_code == 3, result.output
    hint = [line for line in result.output.splitlines() if line.startswith("hint:")]
    assert hint and "fix the keys named above" not in hint[0], result.output
