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
    # every rank binds loopback and restricts model control to $TRTSPEC_ADMIN_KEY, which is never printed
    for flag in ("--http-address=127.0.0.1", "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                 "--http-restricted-api=model-repository,shared-memory,trace,logging:trtspec-admin-key=${TRTSPEC_ADMIN_KEY}",
                 "--grpc-restricted-protocol=model-repository,shared-memory,trace,logging:trtspec-admin-key="
                 "${TRTSPEC_ADMIN_KEY}"):
        assert argv.count(flag) == 2, flag
    shell = json.loads(result.output)["shell"]
    assert 'trtspec-admin-key="${TRTSPEC_ADMIN_KEY:?' in shell


def test_print_command_binds_elsewhere_or_opens_model_control_only_when_asked(make_spec, workdir, monkeypatch):
    make_spec("eagle", name="e1")
    monkeypatch.setenv("TRTSPEC_ADMIN_KEY", "secret-key-not-to-print-0123")
    runner = CliRunner()
    shown = runner.invoke(main, ["serve", "-c", str(workdir / "e1.toml"), "--print-command", "--host", "0.0.0.0"])
    assert shown.exit_code == 0, shown.output
    assert "--http-address=0.0.0.0" in shown.output and "secret-key-not-to-print" not in shown.output
    opened = runner.invoke(main, ["serve", "-c", str(workdir / "e1.toml"), "--json", "--open-model-control"])
    assert not any("restricted" in a for a in json.loads(opened.output)["argv"])


def test_serving_outside_the_container_is_one_clear_error(make_spec, workdir, build_opts, record):
    from trtspec.backends import build

    build(make_spec("lookahead", name="la"), build_opts())
    result = CliRunner().invoke(main, ["serve", "-c", str(workdir / "la.toml"),
                                       "--repo", str(workdir / "model_repository")])
    assert result.exit_code == 5, result.output
    assert "error: runtime 'trtllm-engine' serves from the Triton TensorRT-LLM container" in result.output
    assert "hint: docker run --gpus all" in result.output
