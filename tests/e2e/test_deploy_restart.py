"""A Triton server restarts on a repository that `trtspec deploy` and `trtspec rollback` have worked in.

Triton takes every subdirectory of its model repository for a model, hidden ones included: the repository
poll lists every entry but "." and ".." (triton-inference-server/core, branch r24.10,
src/filesystem/implementations/local.h, GetDirectorySubdirs; src/model_repository_manager/
model_repository_manager.cc, Poll). A server that loads its whole repository at start (model control
`none`, `poll`, or `explicit` with `--load-model=*`) then fails to start on anything else found there.

Two deploys (v1 in place, v2 beside it as the candidate) onto a running explicit-mode server; then a fresh
server in each of those modes must load every model, and only the models, and serve v2's greedy text;
after `trtspec rollback`, fresh servers serve v1 again. That rollback runs on the repository as an older trtspec
left it (its state inside DIR; such a repository starts only with its models named): it moves the state out
with one warning line and rolls back by the older record. The demo versions: tests/e2e/conftest.py."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.e2e.conftest import VersionBuild
from trtspec.cli import main
from trtspec.client import generate_remote
from trtspec.repository import pbtxt
from trtspec.serve import TritonServer
from trtspec.serve.control import REVISION_PARAM, ModelControl
from trtspec.serve.deploy import ENGINES_SUBDIR, LEGACY_BACKUP_PREFIX, LEGACY_LOCK_FILE, Layout, read_records

pytestmark = pytest.mark.e2e
PROMPT, TOKENS = "def fibonacci(n):\n    ", 16
MODES = {"none": (), "poll": (), "explicit": ("*",)}  # model control -> --load-model


@dataclasses.dataclass
class Deployed:
    repo: Path                         # the server repository (--server-repo)
    work: Path
    v1: VersionBuild
    v2: VersionBuild
    first: dict                        # `trtspec deploy --json` of v1, then of v2
    second: dict

    def server(self, mode: str) -> TritonServer:
        return TritonServer(self.repo, model_control=mode, load_models=MODES[mode], ready_timeout=120,
                            work_dir=self.work / mode)


def _cli(*args, warnings: int = 0) -> dict:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == warnings and all(line.startswith("warning: ") for line in lines), result.stderr
    return json.loads(result.stdout)


def _deploy(server: TritonServer, repo: Path, build: VersionBuild) -> dict:
    return _cli("deploy", "-c", build.spec.source, "--url", server.http_url, "--grpc-url", server.grpc_url,
                "--server-repo", repo, "--repo", build.root / "model_repository", "--engines", build.root / "engines",
                "--admin-key", server.admin_key, "--smoke-prompt", PROMPT, "--smoke-tokens", TOKENS, "--json")


def _assert_serves(server: TritonServer, models: list[str], revision: str, text: str) -> None:
    """Every model of the repository, and only those, is ready at `revision`, and the ensemble answers `text`."""
    with ModelControl(server.http_url, server.admin_key) as control:
        index = control.index()
        assert index == dict.fromkeys(models, "READY"), index
        assert control.server_ready()
        served = {m: ((control.config(m).get("parameters") or {}).get(REVISION_PARAM) or {}).get("string_value")
                  for m in models}
    assert served == dict.fromkeys(models, revision)
    assert generate_remote(server.grpc_url, PROMPT, max_tokens=TOKENS, model=models[0]).text == text


def _stop(server: TritonServer) -> None:
    code = server.stop()
    assert code == 0, f"tritonserver did not shut down cleanly: {server.failure_report()}"


def _top_level(repo: Path) -> list[str]:
    return sorted(p.name for p in repo.iterdir())


def _as_an_older_trtspec_left_it(deployed: Deployed) -> None:
    """Move the state into DIR where trtspec kept it before (DIR/.trtspec-engines/<name>, DIR/.trtspec-backup-<rev>,
    DIR/.trtspec-deploy.lock; engine_dir = ".trtspec-engines/<name>"), and point v2's deploy record there."""
    layout, name = Layout(deployed.repo), deployed.v2.spec.name
    (deployed.repo / ENGINES_SUBDIR).mkdir()
    (layout.engines / name).rename(deployed.repo / ENGINES_SUBDIR / name)
    backup = deployed.repo / f"{LEGACY_BACKUP_PREFIX}{Path(deployed.second['backup']).name}"
    Path(deployed.second["backup"]).rename(backup)
    for model_dir in [deployed.repo / m for m in deployed.second["models"]] + [backup / m for m in
                                                                               deployed.second["models"]]:
        config = pbtxt.read_config(model_dir / "config.pbtxt")
        if "engine_dir" in config.parameters:
            config.parameters["engine_dir"].string_value = f"{ENGINES_SUBDIR}/{name}"
            pbtxt.write_config(model_dir, config)
    shutil.rmtree(layout.state)
    (deployed.repo / LEGACY_LOCK_FILE).touch()
    record = read_records(deployed.v2.root / "engines", name, deployed.repo)[-1]
    path = Path(record.pop("_path"))
    path.write_text(json.dumps(record | {"backup": str(backup)}))


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, versions) -> Deployed:
    """v1, then v2, deployed onto a running explicit-mode server on an empty repository; the server stopped."""
    root = tmp_path_factory.mktemp("deploy_restart")
    repo = root / "models"
    repo.mkdir()
    server = TritonServer(repo, load_models=(), ready_timeout=120, work_dir=root / "work" / "deploy")
    server.start()
    try:
        first = _deploy(server, repo, versions[0])
        second = _deploy(server, repo, versions[1])
    finally:
        _stop(server)
    assert first["strategy"] == "in place" and second["strategy"] == "candidate"
    assert first["smoke"]["text"] != second["smoke"]["text"]  # each text tells which version serves
    return Deployed(repo, root / "work", *versions, first, second)


@pytest.mark.parametrize("mode", list(MODES))
def test_a_fresh_server_serves_the_newest_deploy(deployed, mode):
    models = deployed.second["models"]
    server = deployed.server(mode)
    server.start()
    try:
        _assert_serves(server, models, deployed.second["revision"], deployed.second["smoke"]["text"])
    finally:
        _stop(server)
    assert _top_level(deployed.repo) == sorted(models)  # nothing but the models in the repository


def test_after_rollback_fresh_servers_serve_the_first_deploy(deployed):
    models, first = deployed.second["models"], deployed.first
    _as_an_older_trtspec_left_it(deployed)
    server = TritonServer(deployed.repo, load_models=models, ready_timeout=120, work_dir=deployed.work / "rollback")
    server.start()
    try:
        back = _cli("rollback", "-c", deployed.v2.spec.source, "--url", server.http_url, "--grpc-url",
                    server.grpc_url, "--server-repo", deployed.repo, "--engines", deployed.v2.root / "engines",
                    "--admin-key", server.admin_key, "--json", warnings=1)
        assert back["migrated"]
        assert back["to_revision"] == first["revision"]
        _assert_serves(server, models, first["revision"], first["smoke"]["text"])
    finally:
        _stop(server)
    assert _top_level(deployed.repo) == sorted(models)
    for mode in ("none", "poll", "explicit"):
        server = deployed.server(mode)
        server.start()
        try:
            _assert_serves(server, models, first["revision"], first["smoke"]["text"])
        finally:
            _stop(server)
