"""Deploy records and backup pruning (no server: the e2e rollback is tests/e2e/test_operate_deploy.py)."""

from __future__ import annotations

import pytest

from trtspec.errors import DeployError
from trtspec.serve.deploy import prune_backups, read_records, records_dir, rollback_spec, write_record


def test_records_live_beside_the_build_and_read_back_in_order(tmp_path):
    engines = tmp_path / "engines"
    (engines / "demo").mkdir(parents=True)
    for rev in ("20260101T000002-1-000002", "20260101T000001-1-000001"):
        write_record(engines, "demo", {"kind": "deploy", "revision": rev, "server_repo": str(tmp_path / "srv")})
    (records_dir(engines, "demo") / "junk.json").write_text("not json")
    assert records_dir(engines, "demo") == (engines / ".deployments" / "demo").resolve()
    assert not list((engines / "demo").iterdir())  # the build output stays as its lock hashed it
    assert [r["revision"] for r in read_records(engines, "demo")] == ["20260101T000001-1-000001",
                                                                       "20260101T000002-1-000002"]
    assert read_records(engines, "demo", tmp_path / "elsewhere") == []


def test_prune_keeps_the_newest_backups(tmp_path):
    for i in range(5):
        (tmp_path / f"2026010{i}T000000-1-00000{i}").mkdir()
    (tmp_path / "notes.txt").touch()
    gone = prune_backups(tmp_path, 2)
    assert len(gone) == 3 and sorted(p.name for p in tmp_path.iterdir()) == [
        "20260103T000000-1-000003", "20260104T000000-1-000004", "notes.txt"]
    assert prune_backups(tmp_path / "none", 2) == []


def test_rollback_without_records_is_a_deploy_error(tmp_path):
    from trtspec.check import spec_from_dict

    spec = spec_from_dict({"schema": 1, "model": {"name": "demo", "target": "t"}, "speculative": {"draft": "d"}})
    with pytest.raises(DeployError, match="no deploy of 'demo' to .* to roll back"):
        rollback_spec(spec, "127.0.0.1:1", tmp_path, out_engines=tmp_path / "engines")


def test_deploy_keep_backups_reaches_the_deploy_and_refuses_zero(tmp_path, monkeypatch):
    """`trtspec deploy --keep-backups N` is what prunes the server repository (default KEEP_BACKUPS); 0 would
    leave rollback nothing to restore, so the CLI refuses it."""
    from click.testing import CliRunner

    from trtspec.backends.base import Backend
    from trtspec.cli import main
    from trtspec.serve.deploy import KEEP_BACKUPS

    seen = {}

    def fake_deploy(self, spec, url, server_repo, **kwargs):
        seen.update(kwargs)
        raise DeployError("stop here")

    monkeypatch.setattr(Backend, "deploy", fake_deploy)
    spec = tmp_path / "trtspec.toml"
    spec.write_text('schema = 1\n[model]\nname = "demo"\ntarget = "t"\n[speculative]\ndraft = "d"\n')
    args = ["deploy", "-c", str(spec), "--url", "127.0.0.1:1", "--server-repo", str(tmp_path / "srv")]
    CliRunner().invoke(main, args)
    assert seen["keep_backups"] == KEEP_BACKUPS
    CliRunner().invoke(main, args + ["--keep-backups", "5"])
    assert seen["keep_backups"] == 5
    seen.clear()
    refused = CliRunner().invoke(main, args + ["--keep-backups", "0"])
    assert refused.exit_code == 64 and "--keep-backups" in refused.output and not seen  # UsageError
