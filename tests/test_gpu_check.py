"""The GPU check's CPU-side parts (bench/gpu_check.py, ci/gpu-check.sh): arguments, the table, the device probe,
and a `--device cpu --quick` dry run of every part (the CUDA run itself needs a GPU machine)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from tests.support import ROOT, needs_demo_models

SCRIPT = ROOT / "ci" / "gpu-check.sh"


def _driver():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


gc = _driver()


def test_arguments_default_to_cuda_every_method_and_batch_1_4_16():
    a = gc.parse_args([])
    assert (a.device, a.batches, a.methods, a.new, a.waves, a.samples) == (
        "cuda", (1, 4, 16), ("draft-model", "eagle", "medusa", "lookahead"), 128, 2, 20000)
    q = gc.parse_args(["--device", "cpu", "--quick", "--methods", "eagle,lookahead", "--skip", "lossless"])
    assert (q.batches, q.methods, q.new, q.skip) == ((1, 4), ("eagle", "lookahead"), 8, {"lossless"})
    for bad in (["--batches", "0,4"], ["--batches", "x"], ["--methods", "mtp"], ["--skip", "everything"],
                ["--device", "cuda:1"]):  # (a GPU is picked with CUDA_VISIBLE_DEVICES)
        with pytest.raises(SystemExit):
            gc.parse_args(bad)


def test_the_table_is_markdown_with_one_line_per_method_and_batch():
    rows = [gc.Row("plain", 1, 0, 100.0, 1.0, 1.0, 0.0, True), gc.Row("eagle", 16, 4, 250.25, 2.5, 3.1, 0.7, False)]
    lines = gc.format_table(rows, "title").splitlines()
    assert lines[0] == "title" and lines[2].startswith("| method | batch | K | tok/s | x plain |")
    assert lines[4] == "| plain | 1 | - | 100.0 | 1.00 | 1.00 | 0.00 | yes |"
    assert lines[5] == "| eagle | 16 | 4 | 250.2 | 2.50 | 3.10 | 0.70 | NO |"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_the_check_says_so_and_exits_2(capsys):
    assert "not available" in gc.device_ok("cuda")
    assert gc.main(["--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


@needs_demo_models
def test_a_cpu_dry_run_of_every_part(tmp_path, capsys):
    out = tmp_path / "check.json"
    code = gc.main(["--device", "cpu", "--quick", "--batches", "1", "--samples", "1200", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    import json

    data = json.loads(out.read_text())
    names = [c["name"] for c in data["checks"]]
    assert "identity: eagle-tree" in names and "lossless: the check catches a broken residual" in names
    assert all(c["ok"] for c in data["checks"]) and "speed table" in names
    assert {(r["method"], r["batch"]) for r in data["rows"]} == {
        (m, 1) for m in ("plain", "draft-model", "eagle", "medusa", "lookahead")}
    assert "| lookahead | 1 | 4 |" in text


def test_the_script_finds_its_python_and_passes_options_through(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
    r = subprocess.run(["bash", str(SCRIPT), "--device", "cpu", "--skip", "identity,lossless,speed"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "device cpu (CPU)" in r.stdout and "0/0 checks passed" in r.stdout
    assert (tmp_path / "gpu-check.json").is_file() and (tmp_path / "gpu-check.md").is_file()
