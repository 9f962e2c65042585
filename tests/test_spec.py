"""The deployment spec: every demo spec loads, every broken spec fails naming its key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support import DEMO, ROOT, needs_demo_models
from trtspec.check import load_spec, spec_from_dict
from trtspec.cli import main
from trtspec.errors import SpecError

BROKEN = sorted((ROOT / "tests/data/specs/broken").glob("*.toml"))


def _expected_key(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), path
    return first.removeprefix("# expect: ").strip()


def _expected_exit(path: Path) -> int:
    """2 (a spec problem) unless the spec says `# exit: N` on its second line (3: the model pair)."""
    second = (path.read_text().splitlines() + [""])[1]
    return int(second.removeprefix("# exit: ")) if second.startswith("# exit: ") else 2


def test_there_are_at_least_twelve_broken_specs():
    assert len(BROKEN) >= 12


@pytest.mark.parametrize("name", ["draft-model", "medusa", "eagle", "lookahead", "ngram", "suffix"])
def test_demo_specs_load(name):
    spec = load_spec(DEMO / f"{name}.toml")
    assert spec.method == name
    assert spec.model.target.is_absolute() and spec.model.target.name == "target"
    assert spec.limits.max_seq_len == spec.limits.max_input_len + spec.limits.max_output_len


@needs_demo_models
@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_check_broken_spec_names_the_key(path):
    result = CliRunner().invoke(main, ["check", "-c", str(path)])
    assert result.exit_code == _expected_exit(path), result.output  # the README's table, as `build` exits
    first_error = next(line for line in result.output.splitlines() if line.startswith("error: "))
    assert _expected_key(path) in first_error, result.output
    assert "hint: " in result.output


@needs_demo_models
@pytest.mark.parametrize("name", ["draft-model", "medusa", "eagle", "lookahead", "ngram", "suffix"])
def test_check_demo_specs_pass(name):
    result = CliRunner().invoke(main, ["check", "-c", str(DEMO / f"{name}.toml")])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("ok")


def test_every_problem_is_listed():
    data = {"schema": 1, "model": {"target": "/nonexistent"},
            "speculative": {"method": "draft-model", "num_draft_tokens": 0, "bogus": 1}}
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    keys = " ".join(info.value.problems)
    assert "speculative.num_draft_tokens" in keys and "speculative.bogus" in keys
    assert len(info.value.problems) == 2


def test_meaning_problems_are_listed_together():
    data = {"schema": 1, "model": {"target": "/t"}, "speculative": {"method": "draft-model"},
            "runtime": {"kind": "trtllm-engine"}}
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    text = "\n".join(info.value.problems)
    for key in ("speculative.draft", "gpu.type", "runtime.device"):
        assert key in text


def test_relative_paths_resolve_against_the_spec_folder(tmp_path):
    (tmp_path / "sub").mkdir()
    spec_file = tmp_path / "sub" / "trtspec.toml"
    spec_file.write_text('schema = 1\n[model]\ntarget = "../models/t"\n[speculative]\nmethod = "none"\n')
    spec = load_spec(spec_file)
    assert spec.model.target == (tmp_path / "models" / "t").resolve()


def test_init_writes_a_valid_spec(tmp_path):
    runner = CliRunner()
    out = tmp_path / "trtspec.toml"
    result = runner.invoke(main, ["init", str(out)])
    assert result.exit_code == 0, result.output
    spec = load_spec(out)
    assert spec.method == "draft-model" and spec.runtime.kind == "torch"
    again = runner.invoke(main, ["init", str(out)])
    assert again.exit_code == 2 and "already exists" in again.output


def test_missing_spec_file_is_one_clear_line(tmp_path):
    result = CliRunner().invoke(main, ["check", "-c", str(tmp_path / "nope.toml")])
    assert result.exit_code == 2
    assert "error: spec file not found" in result.output and "hint:" in result.output
    assert "Traceback" not in result.output


def test_check_json(tmp_path):
    spec_file = tmp_path / "s.toml"
    spec_file.write_text('schema = 1\n[model]\ntarget = "t"\n[speculative]\nmethod = "none"\n')
    result = CliRunner().invoke(main, ["check", "-c", str(spec_file), "--no-models", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["ok"] is True and data["spec"]["schema"] == 1


def test_help_lists_commands_and_exit_codes():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    for word in ("init", "check", "build", "Exit codes"):
        assert word in result.output
