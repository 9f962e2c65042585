"""Deploy records and `trtspec rollback` against a real Triton server (explicit model control, its own
empty repository, the demo draft-model deployment): two deploys leave two records; rollback restores the
first version beside the running one, and it serves; the first deploy replaced nothing, so a second
rollback is refused."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.support import DEMO, demo_ready
from trtspec.backends import build
from trtspec.builders import BuildOptions
from trtspec.cli import main
from trtspec.client import generate_remote
from trtspec.serve import TritonServer

pytestmark = pytest.mark.e2e
PROMPT, TOKENS = "def fibonacci(n):\n    ", 16


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_deploy_records_then_rollback_restores_the_previous_version(tmp_path):
    from trtspec.check import load_spec
    from trtspec.serve.control import server_status

    if not demo_ready("target", "draft"):
        pytest.skip("demo family not trained yet")
    spec = load_spec(DEMO / "draft-model.toml")
    out = tmp_path / "out"
    build(spec, BuildOptions(out_engines=out / "engines", out_repo=out / "model_repository", progress=False))
    repo = tmp_path / "server_repo"
    repo.mkdir()
    server = TritonServer(repo, load_models=(), ready_timeout=120, work_dir=tmp_path / "work")
    server.start()
    try:
        common = ["-c", spec.source, "--url", server.http_url, "--server-repo", repo, "--admin-key", server.admin_key]
        deploy = [*common, "--grpc-url", server.grpc_url, "--repo", out / "model_repository", "--engines",
                  out / "engines", "--smoke-prompt", PROMPT, "--smoke-tokens", TOKENS, "--json"]
        results = []
        for _ in range(2):
            r = _cli("deploy", *deploy)
            assert r.exit_code == 0, r.output
            results.append(json.loads(r.output))
        first, second = results
        assert second["strategy"] == "candidate" and second["backup"]
        listed = _cli("rollback", *common, "--engines", out / "engines", "--list", "--json")
        assert [(r["revision"], r["kind"]) for r in json.loads(listed.output)] == [
            (first["revision"], "deploy"), (second["revision"], "deploy")]
        record = json.loads((out / "engines" / ".deployments" / spec.name / f"{second['revision']}.json").read_text())
        assert record["smoke"]["identical"] and record["lock"]["digest"] and set(record["configs"]) == set(
            second["models"])

        r = _cli("rollback", *common, "--grpc-url", server.grpc_url, "--engines", out / "engines", "--json")
        assert r.exit_code == 0, r.output
        back = json.loads(r.output)
        assert back["from_revision"] == second["revision"] and back["to_revision"] == first["revision"]
        status = server_status(server.http_url, server.admin_key, metrics_url=server.metrics_url)
        assert {m: status["models"][m]["revision"] for m in second["models"]} == dict.fromkeys(
            second["models"], first["revision"])
        assert all(status["models"][m]["ready"] for m in second["models"])
        served = generate_remote(server.grpc_url, PROMPT, max_tokens=TOKENS, model=spec.serving.ensemble_name)
        assert served.text == first["smoke"]["text"]  # the first version serves again, greedy, same text
        again = _cli("rollback", *common, "--grpc-url", server.grpc_url, "--engines", out / "engines")
        assert again.exit_code == 5 and "replaced nothing, or its backup is gone" in again.output
    finally:
        code = server.stop()
    assert code == 0, f"tritonserver did not shut down cleanly: {server.failure_report()}"
