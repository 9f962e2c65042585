"""Where a deploy keeps its state (beside the server repository, never in it), the refusals of a repository it
cannot work beside, and the migration of what an older trtspec left inside one (no server: the restart of a real
Triton after deploy and rollback is tests/e2e/test_deploy_restart.py)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.cli import main
from trtspec.errors import DeployError
from trtspec.repository import pbtxt
from trtspec.repository.serving import resolve_engine_dir
from trtspec.serve.deploy import (
    ENGINES_SUBDIR,
    LEGACY_BACKUP_PREFIX,
    LEGACY_LOCK_FILE,
    LEGACY_STAGE_PREFIX,
    Layout,
    migrate,
    server_layout,
    tidy,
    write_record,
)
from trtspec.serve.deploy.layout import _deploy_lock, prepare

MODELS = ("ensemble", "preprocessing", "tensorrt_llm", "postprocessing")
REV = "20260101T000000-1-000001"


def _model(root: Path, name: str, engine_dir: str | None, revision: str = REV) -> None:
    params = {"trtspec_revision": revision} | ({"engine_dir": engine_dir} if engine_dir is not None else {})
    config = pbtxt.ModelConfig(name=name, backend="python")
    pbtxt.set_parameters(config, params)
    pbtxt.write_config(root / name, config)
    (root / name / "1").mkdir(exist_ok=True)


def _engine_param(model_dir: Path) -> str:
    return pbtxt.read_config(model_dir / "config.pbtxt").parameters["engine_dir"].string_value


def _legacy_repo(tmp_path: Path) -> Path:
    """What an older trtspec left after two deploys: engines, a backup, a dead stage dir and its lock in DIR."""
    repo = tmp_path / "models"
    for m in MODELS:
        _model(repo, m, f"{ENGINES_SUBDIR}/demo", "20260102T000000-1-000002")
    (repo / ENGINES_SUBDIR / "demo").mkdir(parents=True)
    (repo / ENGINES_SUBDIR / "demo" / "spec.json").write_text("{}")
    backup = repo / f"{LEGACY_BACKUP_PREFIX}{REV}"
    for m in MODELS:
        _model(backup, m, f"{ENGINES_SUBDIR}/demo")
    (backup / ENGINES_SUBDIR / "demo").mkdir(parents=True)
    (repo / f"{LEGACY_STAGE_PREFIX}20260103T000000-9-000003" / "ensemble").mkdir(parents=True)
    (repo / LEGACY_LOCK_FILE).touch()
    _model(repo, "other", None)  # a model of someone else's: left as it is
    return repo


def test_the_state_lives_beside_the_repository_and_the_models_find_their_engine(tmp_path):
    repo = tmp_path / "srv" / "models"
    repo.mkdir(parents=True)
    layout = server_layout(repo)
    prepare(layout)
    assert layout.state == tmp_path / "srv" / "models.trtspec" and layout.lock.parent == layout.state
    assert sorted(p.name for p in layout.state.iterdir()) == ["backups", "engines", "stage"]
    assert not list(repo.iterdir())  # the probe file came and went
    (layout.engines / "demo").mkdir()
    (layout.stage("r1") / ENGINES_SUBDIR / "demo").mkdir(parents=True)
    # a model's relative engine_dir resolves against the repository root, as the served model resolves it
    assert resolve_engine_dir(repo / "ensemble", {"engine_dir": layout.engine_param("demo")}) == layout.engines / "demo"
    assert resolve_engine_dir(repo / "tensorrt_llm__trtspec_next", {"engine_dir": layout.engine_param("demo", "r1")}
                              ) == layout.stage("r1") / ENGINES_SUBDIR / "demo"
    assert layout.engine_param("demo") == "../models.trtspec/engines/demo"
    assert layout.final(f"{ENGINES_SUBDIR}/demo") == layout.engines / "demo"
    assert layout.final("ensemble") == repo / "ensemble"


def test_a_repository_that_is_a_mount_point_or_missing_is_refused(tmp_path, monkeypatch):
    with pytest.raises(DeployError, match="is not a directory"):
        server_layout(tmp_path / "none")
    with pytest.raises(DeployError, match="is a mount point") as info:
        server_layout("/")  # the one mount point every machine has
    assert info.value.exit_code == 5 and "mount the volume one level up" in info.value.hint
    repo = tmp_path / "models"
    repo.mkdir()
    real = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda p: Path(p) == repo or real(p))
    result = CliRunner().invoke(main, ["deploy", "--server-repo", str(repo), "--tidy"])
    assert result.exit_code == 5 and "is a mount point" in result.output and not (tmp_path / "models.trtspec").exists()


def test_a_repository_on_another_mount_than_its_sibling_is_refused(tmp_path, monkeypatch):
    """A bind mount is no mount point to os.path.ismount when it comes from the same filesystem, yet a rename
    out of it fails with EXDEV: prepare's probe finds that."""
    repo = tmp_path / "models"
    repo.mkdir()
    layout = server_layout(repo)

    def cross(src, dst):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "replace", cross)
    with pytest.raises(DeployError, match="on different mounts") as info:
        prepare(layout)
    assert "one level up" in info.value.hint
    monkeypatch.undo()
    assert not list(repo.iterdir()) and not list(layout.stages.iterdir())  # no probe left behind


def test_an_unwritable_parent_is_a_deploy_error(tmp_path, monkeypatch):
    repo = tmp_path / "models"
    repo.mkdir()
    layout = server_layout(repo)
    real = Path.mkdir

    def denied(self, *args, **kwargs):
        if self == layout.state:
            raise PermissionError(errno.EACCES, "Permission denied")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", denied)
    with pytest.raises(DeployError, match="cannot make the deploy state dir") as info:
        prepare(layout)
    assert "must be writable" in info.value.hint


def test_migrate_moves_an_older_deploy_out_and_repoints_the_configs(tmp_path):
    repo = _legacy_repo(tmp_path)
    layout = server_layout(repo)
    prepare(layout)
    with _deploy_lock(layout):
        done = migrate(layout)
    assert sorted(p.name for p in repo.iterdir()) == sorted([*MODELS, "other"])  # only models are left
    assert (layout.engines / "demo" / "spec.json").is_file()
    assert (layout.backup(REV) / "tensorrt_llm" / "config.pbtxt").is_file()
    assert (layout.backup(REV) / ENGINES_SUBDIR / "demo").is_dir()
    for model_dir in [repo / m for m in MODELS] + [layout.backup(REV) / m for m in MODELS]:
        assert _engine_param(model_dir) == "../models.trtspec/engines/demo"
        assert resolve_engine_dir(repo / model_dir.name, {"engine_dir": _engine_param(model_dir)}) == (
            layout.engines / "demo")
    assert "engine_dir" not in pbtxt.read_config(repo / "other" / "config.pbtxt").parameters
    assert len(done) == 5 and any("removed .trtspec-deploy.lock" in d for d in done), done
    assert any(d.startswith(f"{LEGACY_BACKUP_PREFIX}{REV}/ -> models.trtspec/backups/{REV}") for d in done), done
    with _deploy_lock(layout):
        assert migrate(layout) == []  # done once: nothing more to do


def test_migration_stops_when_the_old_and_the_new_place_both_hold_an_engine(tmp_path):
    repo = _legacy_repo(tmp_path)
    layout = server_layout(repo)
    prepare(layout)
    (layout.engines / "demo").mkdir()
    with pytest.raises(DeployError, match="both exist") as info, _deploy_lock(layout):
        migrate(layout)
    assert "--tidy" in info.value.hint and (repo / ENGINES_SUBDIR / "demo").is_dir()


def test_an_older_deploy_holding_its_lock_keeps_others_out(tmp_path):
    repo = _legacy_repo(tmp_path)
    layout = server_layout(repo)
    prepare(layout)
    fd = os.open(repo / LEGACY_LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # an older trtspec's deploy is running
        with pytest.raises(DeployError, match="another deploy into .* is running") as info:
            tidy(repo)
        assert "one at a time" in info.value.hint
    finally:
        os.close(fd)
    assert (repo / ENGINES_SUBDIR).is_dir()  # it touched nothing


def test_deploy_tidy_migrates_with_one_warning_line_and_needs_no_server(tmp_path):
    repo = _legacy_repo(tmp_path)
    (repo / "tensorrt_llm__trtspec_next").mkdir()  # a dead deploy's candidate
    runner = CliRunner()
    first = runner.invoke(main, ["deploy", "--server-repo", str(repo), "--tidy"])
    assert first.exit_code == 0, first.output
    assert first.output.startswith("warning: moved what an older trtspec left inside ") and first.output.count(
        "\n") == 1
    assert sorted(p.name for p in repo.iterdir()) == sorted([*MODELS, "other"])
    again = runner.invoke(main, ["deploy", "--server-repo", str(repo), "--tidy", "--json"])
    assert json.loads(again.output) == {"server_repo": str(repo), "state": str(tmp_path / "models.trtspec"),
                                        "moved": []}
    no_url = runner.invoke(main, ["deploy", "--server-repo", str(repo)])
    assert no_url.exit_code == 64 and "--url" in no_url.output


def test_an_older_deploy_record_still_finds_its_backup(tmp_path, monkeypatch):
    """A record of an older trtspec names DIR/.trtspec-backup-<rev>: before and after the migration, rollback
    finds that backup and goes on to the server (which is not there: one line, exit 5)."""
    from trtspec.check import spec_from_dict
    from trtspec.serve import free_port
    from trtspec.serve.deploy import rollback_spec

    repo, engines = _legacy_repo(tmp_path), tmp_path / "engines"
    spec = spec_from_dict({"schema": 1, "model": {"name": "demo", "target": "t"}, "speculative": {"draft": "d"}})
    write_record(engines, "demo", {"kind": "deploy", "revision": "20260102T000000-1-000002",
                                   "server_repo": str(repo), "models": list(MODELS),
                                   "replaced": [*MODELS, f"{ENGINES_SUBDIR}/demo"],
                                   "backup": str(repo / f"{LEGACY_BACKUP_PREFIX}{REV}")})
    layout = Layout(repo)
    for _ in ("before", "after"):
        with pytest.raises(DeployError, match="cannot reach Triton"):
            rollback_spec(spec, f"127.0.0.1:{free_port()}", repo, out_engines=engines)
        tidy(repo)
    assert layout.legacy_backup(repo / f"{LEGACY_BACKUP_PREFIX}{REV}") == layout.backup(REV)
    assert layout.legacy_backup(layout.backup(REV)) == layout.backup(REV)
