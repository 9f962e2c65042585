"""`trtspec deploy` against a real Triton server started here in explicit model-control mode on an
empty repository directory (the demo draft-model deployment): a first deploy that loads and passes
its smoke test, a broken `--no-candidate` redeploy that rolls back to the previous deployment, one
deploy at a time, and one-line preflight errors. Deploys under traffic: test_deploy_traffic.py."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support import DEMO, demo_ready
from trtspec.backends import build
from trtspec.builders import BuildOptions
from trtspec.cli import main
from trtspec.client import generate_remote
from trtspec.errors import DeployError
from trtspec.serve import TritonServer, free_port
from trtspec.serve.deploy import (
    CANDIDATE_SUFFIX,
    LEGACY_STAGE_PREFIX,
    REVISION_PARAM,
    Layout,
    deploy_spec,
    resolve_grpc_url,
)

pytestmark = pytest.mark.e2e
TOKENS = 24
PROMPT = "def fibonacci(n):\n    "


@dataclasses.dataclass
class Target:
    server: TritonServer
    repo: Path                 # the server's model repository (--server-repo)
    spec: object
    out: Path                  # parent of engines/ and model_repository/ of the first build
    prompt: str
    cli_output: dict           # `trtspec deploy --json` of the first deploy


def _build(spec, root: Path) -> Path:
    build(spec, BuildOptions(out_engines=root / "engines", out_repo=root / "model_repository", progress=False))
    return root


def _models_ready(url: str, models: list[str]) -> bool:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url)
    try:
        return all(client.is_model_ready(m) for m in models)
    finally:
        client.close()


def _cli(spec, server: TritonServer, repo: Path, out: Path, *extra: str):
    return CliRunner().invoke(main, [
        "deploy", "-c", str(spec.source), "--url", server.http_url, "--grpc-url", server.grpc_url,
        "--server-repo", str(repo), "--repo", str(out / "model_repository"), "--engines", str(out / "engines"),
        "--smoke-prompt", PROMPT, "--smoke-tokens", str(TOKENS), "--admin-key", server.admin_key, *extra])


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A fresh explicit-mode server on an empty repository, and the first deploy done with the CLI."""
    from trtspec.check import load_spec

    if not demo_ready("target", "draft"):
        pytest.skip("demo family not trained yet")
    root = tmp_path_factory.mktemp("deploy")
    spec = load_spec(DEMO / "draft-model.toml")
    out = _build(spec, root / "first")
    repo = root / "server_repo"
    repo.mkdir()
    server = TritonServer(repo, load_models=(), ready_timeout=120, work_dir=root / "work")
    server.start()
    try:
        result = _cli(spec, server, repo, out, "--json")
        assert result.exit_code == 0, result.output
        yield Target(server, repo, spec, out, PROMPT, json.loads(result.output))
    finally:
        code = server.stop()
    assert code == 0, f"tritonserver did not shut down cleanly: {server.failure_report()}"


def test_deploy_loads_and_smoke_tests_the_build(target):
    from trtspec import methods
    from trtspec.repository.serving import load_engine_spec
    from trtspec.runtime import SamplingParams

    out, spec = target.cli_output, target.spec
    ensemble = spec.serving.ensemble_name
    assert out["models"][0] == ensemble and len(out["models"]) == 4
    assert _models_ready(target.server.http_url, out["models"])
    smoke = out["smoke"]
    assert smoke["identical"] and smoke["text"] and smoke["text"] == smoke["text_plain"]
    assert smoke["new_tokens"] == TOKENS and smoke["ttft_seconds"] > 0
    assert out["backup"] is None and out["replaced"] == []  # the repository was empty
    assert out["strategy"] == "in place"  # nothing served: no candidate needed
    # the engines travelled beside the models, and the models find them through a relative parameter; the
    # repository holds the models and nothing else (Triton would take anything else for a model)
    layout = Layout(target.repo)
    assert (layout.engines / spec.name / "trtspec.lock.json").is_file()
    config = (target.repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert f'string_value: "../{target.repo.name}.trtspec/engines/{spec.name}"' in config and REVISION_PARAM in config
    assert sorted(p.name for p in target.repo.iterdir()) == sorted(out["models"])
    assert not list(layout.stages.iterdir())
    # served text = plain greedy decoding of the deployed weights, in process
    served = generate_remote(target.server.grpc_url, target.prompt, max_tokens=TOKENS, model=ensemble).text
    engine = methods.engine(load_engine_spec(layout.engines / spec.name))
    try:
        local = engine.generate(target.prompt, SamplingParams(max_new_tokens=TOKENS, num_draft_tokens=0)).text
    finally:
        engine.close()
    assert served == smoke["text"] == local


def test_a_broken_redeploy_in_place_rolls_back_to_the_previous_deployment(target, tmp_path):
    spec, server = target.spec, target.server
    ensemble = spec.serving.ensemble_name
    before = generate_remote(server.grpc_url, target.prompt, max_tokens=TOKENS, model=ensemble).text
    good_source = (target.repo / "tensorrt_llm" / "1" / "model.py").read_bytes()
    broken = _build(spec, tmp_path / "second")
    model_py = broken / "model_repository" / spec.name / "tensorrt_llm" / "1" / "model.py"
    model_py.write_text(model_py.read_text() + "\nraise RuntimeError('broken-build-7')\n")
    # what a deploy killed mid-way leaves behind (and an older trtspec's): the next one clears it
    layout = Layout(target.repo)
    stale = [layout.stage("dead"), target.repo / f"{LEGACY_STAGE_PREFIX}dead",
             target.repo / f"tensorrt_llm{CANDIDATE_SUFFIX}"]
    for path in stale:
        (path / "1").mkdir(parents=True)

    result = _cli(spec, server, target.repo, broken, "--no-candidate")
    assert result.exit_code == DeployError.exit_code, result.output
    warning, error, hint = result.output.splitlines()  # one line each, no Python traceback
    assert warning.startswith("warning: moved what an older trtspec left") and f"{LEGACY_STAGE_PREFIX}dead" in warning
    assert error.startswith("error: ") and hint.startswith("hint: ") and " At: " not in error
    assert "failed at the load" in error and "broken-build-7" in error and "rolled back" in error
    # the previous files are back, the backup is consumed, nothing staged is left over
    assert (target.repo / "tensorrt_llm" / "1" / "model.py").read_bytes() == good_source
    assert not list(layout.backups.iterdir()) and not list(layout.stages.iterdir())
    assert not any(path.exists() for path in stale)
    assert sorted(p.name for p in target.repo.iterdir()) == sorted(target.cli_output["models"])
    # and the previous deployment serves the same output again
    assert _models_ready(server.http_url, target.cli_output["models"])
    assert generate_remote(server.grpc_url, target.prompt, max_tokens=TOKENS, model=ensemble).text == before


def test_one_deploy_at_a_time(target):
    spec, server = target.spec, target.server
    fd = os.open(Layout(target.repo).lock, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another deploy holds the repository
        with pytest.raises(DeployError, match="another deploy into .* is running") as info:
            deploy_spec(spec, server.http_url, target.repo, grpc_url=server.grpc_url,
                        out_repo=target.out / "model_repository", out_engines=target.out / "engines",
                        admin_key=server.admin_key)
        assert info.value.exit_code == 5 and "one at a time" in info.value.hint
    finally:
        os.close(fd)
    assert not list(Layout(target.repo).stages.iterdir())  # it touched nothing
    assert _models_ready(server.http_url, target.cli_output["models"])


def test_preflight_errors_are_one_line(target, tmp_path):
    spec, server = target.spec, target.server
    runner = CliRunner()
    base = ["deploy", "-c", str(spec.source), "--server-repo", str(target.repo)]
    no_build = runner.invoke(main, base + ["--url", server.http_url, "--grpc-url", server.grpc_url,
                                           "--repo", str(tmp_path / "none"), "--engines", str(tmp_path / "none")])
    assert no_build.exit_code == DeployError.exit_code
    assert no_build.output.startswith("error: no built model repository")
    assert f"hint: trtspec build -c {spec.source}" in no_build.output and len(no_build.output.splitlines()) == 2

    dead = f"localhost:{free_port()}"
    unreachable = runner.invoke(main, base + ["--url", dead, "--grpc-url", server.grpc_url,
                                              "--repo", str(target.out / "model_repository"),
                                              "--engines", str(target.out / "engines")])
    assert unreachable.exit_code == DeployError.exit_code
    assert unreachable.output.startswith(f"error: cannot reach Triton at {dead}\n")
    assert len(unreachable.output.splitlines()) == 2
    assert _models_ready(server.http_url, target.cli_output["models"])  # nothing was touched


def test_grpc_url_comes_from_the_serve_state_or_is_required(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTSPEC_STATE_DIR", str(tmp_path))
    with pytest.raises(DeployError, match="cannot tell the gRPC port") as info:
        resolve_grpc_url("myhost:8123", None)
    assert "--grpc-url" in info.value.hint
    state = {"pid": os.getpid(), "http_port": 8123, "grpc_port": 8124}
    (tmp_path / "serve-other.json").write_text(json.dumps(state))
    assert resolve_grpc_url("myhost:8123", None) == "myhost:8124"
    assert resolve_grpc_url("myhost:8123", "grpc://h:1") == "h:1"
