"""`trtspec check` for the TensorRT-LLM runtime: memory plan shown, engine/server version mismatch refused."""

from __future__ import annotations

import shutil

from click.testing import CliRunner

from tests.support import MODELS, needs_demo_models
from trtspec.backends import build
from trtspec.cli import main


@needs_demo_models
def test_check_prints_the_memory_plan_and_refuses_a_server_version_mismatch(make_spec, build_opts, record,
                                                                              workdir):
    for role in ("target", "draft"):  # the pair check wants the shared tokenizer
        shutil.copy(MODELS / "target" / "tokenizer.json", workdir / role / "tokenizer.json")
    spec = build(make_spec("draft-model", limits="max_batch_size = 4\nmax_input_len = 64\nmax_output_len = 64"),
                 build_opts())
    assert spec.rebuilt  # the stand-in built both engines
    config = str(workdir / "draft-model.toml")
    engines = str(workdir / "engines")
    runner = CliRunner()

    same = runner.invoke(main, ["check", "-c", config, "--engines", engines])
    assert "GiB" in same.output or "MiB" in same.output  # the memory plan table
    assert "checked against TensorRT-LLM 1.2.1" in same.output
    # the stand-in's engines are never taken for real ones, but their version matches
    errors = [line for line in same.output.splitlines() if line.startswith("error: ")]
    assert same.exit_code == 4 and errors and all("FAKE engine" in line for line in errors), same.output

    other = runner.invoke(main, ["check", "-c", config, "--engines", engines, "--server-trtllm-version", "1.1.0"])
    assert other.exit_code == 4, other.output  # engines unfit for the server: a build problem, as for `build`
    errors = [line for line in other.output.splitlines() if line.startswith("error: ")]
    assert any("engines:" in line and "1.1.0" in line and "FAKE" not in line for line in errors), \
        other.output
