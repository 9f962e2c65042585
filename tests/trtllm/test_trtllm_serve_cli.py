"""`trtspec serve` for the TensorRT-LLM runtimes: the container's launch command, or a clear refusal."""

from __future__ import annotations

import json

from click.testing import CliRunner

from trtspec.cli import main


def test_print_command_runs_one_rank_per_gpu(make_spec, workdir):
    make_spec("eagle", name="tp2", gpu='type = "h200"\ncount = 2\ntensor_parallel = 2')
    result = CliRunner().invoke(main, ["serve", "-c", str(workdir / "tp2.toml"), "--json"])
    assert result.exit_code == 0, result.output
    argv = json.loads(result.output)["argv"]
    assert argv[:2] == ["mpirun", "--allow-run-as-root"]
    assert argv.count("/opt/tritonserver/bin/tritonserver") == 2  # world size = TP x PP
    assert any(a.startswith("--model-repository=") and a.endswith("/tp2") for a in argv)


def test_serving_outside_the_container_is_one_clear_error(make_spec, workdir, build_opts, record):
    from trtspec.build import build

    build(make_spec("lookahead", name="la"), build_opts())
    result = CliRunner().invoke(main, ["serve", "-c", str(workdir / "la.toml"),
                                       "--repo", str(workdir / "model_repository")])
    assert result.exit_code == 5, result.output
    assert "error: runtime 'trtllm-engine' serves from the Triton TensorRT-LLM container" in result.output
    assert "hint: docker run --gpus all" in result.output
