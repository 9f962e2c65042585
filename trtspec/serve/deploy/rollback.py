"""`trtspec rollback`: the newest deploy record's backup back under the serving names, reloaded beside what runs."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtspec.artifacts.fs import write_json
from trtspec.errors import DeployError
from trtspec.serve.control import REVISION_PARAM, ModelControl
from trtspec.serve.deploy.layout import _deploy_lock, _stamp, prepare, server_layout
from trtspec.serve.deploy.loading import _message, _reload, _revision, _StepFailed
from trtspec.serve.deploy.migrate import migrate, migration_note
from trtspec.serve.deploy.preflight import _check_server, _http_url, resolve_grpc_url
from trtspec.serve.deploy.records import read_records, records_dir, write_record
from trtspec.serve.deploy.smoke import DEFAULT_SMOKE_PROMPT, SmokeResult, smoke_test
from trtspec.spec import Spec


def _served_revisions(client: ModelControl, models: list[str]) -> dict[str, str | None]:
    return {m: _revision(client, m) if client.model_ready(m) else None for m in models}


def _config_revision(model_dir: Path) -> str | None:
    from trtspec.repository import pbtxt

    config = pbtxt.read_config(model_dir / "config.pbtxt")
    return config.parameters[REVISION_PARAM].string_value if REVISION_PARAM in config.parameters else None


@dataclasses.dataclass
class RollbackResult:
    name: str
    url: str
    server_repo: str
    models: list[str]
    from_revision: str                 # what served before the rollback
    to_revision: str | None            # what serves now (the previous deployment's)
    record: str                        # the deploy record rolled back
    backup: str                        # where the rolled-back files are kept
    smoke: SmokeResult | None
    seconds: float
    migrated: list[str] = dataclasses.field(default_factory=list)  # an older trtspec's state moved out of DIR

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["smoke"] = self.smoke.to_dict() if self.smoke else None
        return d


def rollback_spec(spec: Spec, url: str, server_repo: str | Path, *, grpc_url: str | None = None,
                  out_engines: str | Path = "engines", timeout: float = 300.0, admin_key: str | None = None,
                  grpc_options=None, smoke_prompt: str = DEFAULT_SMOKE_PROMPT, smoke_tokens: int = 32,
                  warn: Callable[[str], None] | None = None) -> RollbackResult:
    """Roll the deployment on the server at `url` back to the version before its newest deploy record: that
    record's backup moves back under the serving names (what served moves to a new backup), each model is
    loaded again beside its running instance, and a greedy smoke request (speculative = plain) must pass.
    Only the newest record not yet rolled back, and only while it is what serves. On failure the files
    swap back and the models reload (a DeployError says what happened). Rolling back again goes one record
    further back, while its backup is kept (KEEP_BACKUPS). Records of an older trtspec, whose backups were
    inside server_repo, roll back once migrate.py has moved them (`warn` gets its one line)."""
    start = time.perf_counter()
    url = _http_url(url)
    layout = server_layout(server_repo)
    server_repo = layout.repo
    records = [r for r in read_records(Path(out_engines), spec.name, server_repo)
               if r.get("kind") == "deploy" and not r.get("rolled_back")]
    hint = f"records are kept by `trtspec deploy` under {records_dir(Path(out_engines), spec.name)}"
    if not records:
        raise DeployError(f"no deploy of {spec.name!r} to {server_repo} to roll back", hint=hint)
    rec = records[-1]
    backup = layout.legacy_backup(Path(rec["backup"])) if rec.get("backup") else None
    if backup is None or not backup.is_dir() or not rec.get("replaced"):
        raise DeployError(f"the newest deploy of {spec.name!r} ({rec['revision']}) replaced nothing, or its backup "
                          f"is gone: there is no previous version to roll back to", hint=hint)
    models, items = list(rec["models"]), list(rec["replaced"])
    _check_server(url)
    grpc = resolve_grpc_url(url, grpc_url, spec)
    prepare(layout)
    with _deploy_lock(layout):
        migrated = migrate(layout)
        if migrated and warn:
            warn(migration_note(layout, migrated))
        backup = layout.legacy_backup(Path(rec["backup"]))
        with ModelControl(url, admin_key, timeout) as client:
            try:
                serving = _served_revisions(client, models)
            except Exception as exc:  # noqa: BLE001
                raise DeployError(f"cannot control models on {url}: {_message(exc)}",
                                  hint="check --url and the admin key (--admin-key)") from None
            stale = sorted({str(v) for v in serving.values() if v != rec["revision"]})
            if stale:
                raise DeployError(f"{url} serves revision {', '.join(stale)} of {spec.name!r}, not the newest "
                                  f"deploy record's ({rec['revision']})",
                                  hint="roll back only what serves: deploy again, or check --url/--server-repo")
            target = {m: _config_revision(backup / m) for m in models if (backup / m / "config.pbtxt").is_file()}
            revision = _stamp()
            kept = layout.backup(revision)
            moved: list[str] = []
            try:
                for rel in items:  # what serves -> the new backup; the previous version -> the serving names
                    (kept / rel).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(layout.final(rel), kept / rel)
                    os.replace(backup / rel, layout.final(rel))
                    moved.append(rel)
                _reload(client, models, target, url, "rollback")
                smoke = smoke_test(grpc, smoke_prompt, model=models[0], max_tokens=smoke_tokens, timeout=timeout,
                                   grpc_options=grpc_options)
            except (_StepFailed, OSError, Exception) as exc:  # noqa: BLE001 - undo, then say what failed
                why = exc.message if isinstance(exc, _StepFailed) else _message(exc)
                try:
                    for rel in reversed(moved):
                        os.replace(layout.final(rel), backup / rel)
                        os.replace(kept / rel, layout.final(rel))
                    shutil.rmtree(kept, ignore_errors=True)
                    _reload(client, models, serving, url, "undo")
                except Exception as undo:  # noqa: BLE001
                    raise DeployError(f"rolling back {spec.name!r} failed ({why}) and undoing it failed too: "
                                      f"{undo.message if isinstance(undo, _StepFailed) else _message(undo)}",
                                      hint="check the server log and its repository by hand") from None
                raise DeployError(f"rolling back {spec.name!r} on {url} failed: {why}; undone: revision "
                                  f"{rec['revision']} serves as before", hint="see the server log") from None
        shutil.rmtree(backup, ignore_errors=True)  # emptied: its files serve again
        write_json(Path(rec["_path"]), {k: v for k, v in rec.items() if k != "_path"} | {"rolled_back": revision})
        result = RollbackResult(spec.name, url, str(server_repo), models, rec["revision"],
                                next(iter(target.values()), None), Path(rec["_path"]).name, str(kept), smoke,
                                time.perf_counter() - start, migrated)
        write_record(Path(out_engines), spec.name, {"kind": "rollback", "revision": revision, **result.to_dict()})
    return result
