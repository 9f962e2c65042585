"""The deploy itself: preflight, stage, candidate beside the serving version (or in place), switch, undo."""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtspec.artifacts.fs import digest, sha256_file
from trtspec.errors import DeployError, TrtspecError
from trtspec.serve.control import ModelControl
from trtspec.serve.deploy.layout import (
    KEEP_BACKUPS,
    Layout,
    _deploy_lock,
    _remove,
    _stamp,
    candidate_name,
    prepare,
    server_layout,
)
from trtspec.serve.deploy.loading import _clear_candidates, _load, _message, _reload, _revision, _StepFailed, _unload
from trtspec.serve.deploy.migrate import migrate, migration_note
from trtspec.serve.deploy.preflight import _check_server, _find_build, _http_url, resolve_grpc_url
from trtspec.serve.deploy.records import prune_backups, write_record
from trtspec.serve.deploy.smoke import DEFAULT_SMOKE_PROMPT, SmokeResult, smoke_test
from trtspec.serve.deploy.staging import _Stage, _stage, _Swap
from trtspec.spec import Spec


@dataclasses.dataclass
class DeployResult:
    name: str
    url: str                           # HTTP endpoint the models were loaded through
    grpc_url: str                      # gRPC endpoint of the smoke test
    server_repo: str
    models: list[str]                  # models ready after the deploy (ensemble first)
    engine_dir: str                    # the deployed engine dir, DIR.trtspec/engines/<name> beside server_repo
    replaced: list[str]                # items of the backup (model dirs, .trtspec-engines/<name>) that held a
                                       # previous version
    backup: str | None                 # where those previous versions are kept (None: nothing replaced)
    smoke: SmokeResult | None
    seconds: float
    strategy: str                      # "candidate": beside the serving version; "in place": unload, then load
    revision: str                      # the trtspec_revision parameter of the deployed configs
    migrated: list[str] = dataclasses.field(default_factory=list)  # an older trtspec's state moved out of DIR

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["smoke"] = self.smoke.to_dict() if self.smoke else None
        return d


@dataclasses.dataclass
class _Deploy:
    """What one deploy works with (see deploy_spec)."""

    spec: Spec
    url: str
    grpc: str
    layout: Layout
    models: list[str]                  # ensemble first
    client: ModelControl
    revision: str
    stage: _Stage
    swap: _Swap
    smoke_prompt: str
    smoke_tokens: int
    timeout: float
    grpc_options: Any
    previous: dict[str, str | None]    # model -> the revision it served before (the switch's rollback target)
    keep_stage: bool = False           # a failed candidate left for inspection reads its engine there

    @property
    def ensemble(self) -> str:
        return self.models[0]

    def smoke(self, model: str) -> SmokeResult:
        return smoke_test(self.grpc, self.smoke_prompt, model=model, max_tokens=self.smoke_tokens,
                          timeout=self.timeout, grpc_options=self.grpc_options)

    def control(self, step: str, fn, *args) -> Any:
        """Run a model-control call; connection errors and the like fail `step` in one line."""
        try:
            return fn(*args)
        except (_StepFailed, OSError):
            raise
        except Exception as exc:  # noqa: BLE001 - connection errors etc.
            raise _StepFailed(step, f"model control on {self.url} failed: {_message(exc)}") from None

    def listed(self, model: str, step: str) -> None:
        if model not in self.client.index():
            raise _StepFailed(step, f"the server at {self.url} does not list {model!r} in its repository: "
                                    f"is {self.layout.repo} the directory it serves?")

    def failed(self, exc: _StepFailed | OSError) -> str:
        step = exc.step if isinstance(exc, _StepFailed) else "stage"
        return f"deploying {self.spec.name!r} to {self.url} failed at the {step}: {_reason(exc)}"


def _reason(exc: _StepFailed | OSError) -> str:
    return exc.message if isinstance(exc, _StepFailed) else str(exc)


def _candidate(d: _Deploy) -> SmokeResult:
    """Step 3: the candidate loaded beside the serving version, smoke-tested and unloaded. It touches
    candidate names only; a _StepFailed names the candidate's step."""
    names = d.stage.candidates
    try:
        for name in names:
            os.replace(d.stage.path / name, d.layout.repo / name)
        d.control("load", d.listed, names[0], "load")
        d.control("load", _load, d.client, names[0], names, d.url)
        smoke = d.smoke(names[0])
        d.control("unload", _clear_candidates, d.client, d.layout.repo, names, d.timeout)
        return smoke
    except _StepFailed as exc:
        exc.step = f"candidate {exc.step}"
        raise


def _switch(d: _Deploy, expected: SmokeResult) -> None:
    """Step 4: the new files under the serving names, each model loaded beside its running instance,
    then proof that the new version is the one serving."""
    from trtspec.client.remote import generate_remote

    d.swap.swap_in(d.stage.path, d.stage.items)
    d.control("switch", _reload, d.client, d.models, dict.fromkeys(d.models, d.revision), d.url, "switch")
    try:
        served = generate_remote(d.grpc, d.smoke_prompt, max_tokens=d.smoke_tokens, model=d.ensemble,
                                 timeout=d.timeout, options=d.grpc_options).text
    except TrtspecError as exc:
        raise _StepFailed("switch", f"request to the switched {d.ensemble!r} failed: {exc.message}") from None
    if served != expected.text:
        raise _StepFailed("switch", f"the switched {d.ensemble!r} answers {served[:40]!r}, the candidate "
                                    f"answered {expected.text[:40]!r}")


def _switch_back(d: _Deploy) -> None:
    """Undo a failed switch: the previous files back, every model loaded again beside what runs."""
    d.swap.restore()
    d.control("rollback", _reload, d.client, d.models, d.previous, d.url, "rollback")


def _in_place(d: _Deploy) -> SmokeResult:
    """Without a candidate: swap, unload, load the ensemble, smoke-test the serving names."""
    d.swap.swap_in(d.stage.path, d.stage.items)
    d.control("load", d.listed, d.ensemble, "load")
    d.control("load", _unload, d.client, d.models, d.timeout)
    d.control("load", _load, d.client, d.ensemble, d.models, d.url)
    return d.smoke(d.ensemble)


def deploy_spec(
    spec: Spec,
    url: str,
    server_repo: str | Path,
    *,
    grpc_url: str | None = None,
    smoke_prompt: str = DEFAULT_SMOKE_PROMPT,
    smoke_tokens: int = 32,
    rollback: bool = True,
    out_repo: str | Path = "model_repository",
    out_engines: str | Path = "engines",
    timeout: float = 300.0,
    admin_key: str | None = None,
    grpc_options=None,
    candidate: bool = True,
    keep_backups: int = KEEP_BACKUPS,
    warn: Callable[[str], None] | None = None,
) -> DeployResult:
    """Deploy the spec's torch build onto the running server at `url` (HTTP HOST:PORT, explicit
    model-control mode) whose model repository is `server_repo`; see the module docstring.
    `admin_key` opens the server's restricted model-repository API; `grpc_options` (TLS, headers)
    are for the smoke test. `candidate=False` replaces a serving version in place (an outage, but
    never two copies of the model in memory). A successful deploy writes its record (records_dir) and keeps the
    newest `keep_backups` backups beside server_repo (rollback needs the newest). `warn` gets the one line
    saying what of an older trtspec's state moved out of server_repo (layout.py, migrate.py)."""
    start = time.perf_counter()
    url = _http_url(url)
    repo_dir, engine_dir, _lock, models = _find_build(spec, Path(out_repo), Path(out_engines))
    layout = server_layout(server_repo)
    server_repo = layout.repo
    _check_server(url)
    grpc = resolve_grpc_url(url, grpc_url, spec)
    candidates = [candidate_name(m) for m in models]
    prepare(layout)

    with _deploy_lock(layout):
        migrated = migrate(layout)
        if migrated and warn:
            warn(migration_note(layout, migrated))
        try:
            client = ModelControl(url, admin_key, timeout)
            previous = client.ready(models)
            revisions = {m: _revision(client, m) for m in previous}
            _clear_candidates(client, server_repo, candidates, timeout)
        except Exception as exc:  # noqa: BLE001 - any client failure is a deploy failure
            raise DeployError(f"cannot control models on {url}: "
                              f"{exc.message if isinstance(exc, _StepFailed) else _message(exc)}",
                              hint="check --url and the admin key (--admin-key)") from None
        for stale in layout.stages.iterdir():  # a dead deploy's (we hold the lock)
            _remove(stale)
        beside = candidate and models[0] in previous
        revision = _stamp()
        try:
            stage = _stage(repo_dir, engine_dir, models, layout, spec.name, revision, beside)
        except OSError as exc:
            client.close()
            raise DeployError(f"cannot stage the build into {layout.stages}: {exc}",
                              hint=f"{layout.state} must be writable and have room for the engines") from None
        d = _Deploy(spec, url, grpc, layout, models, client, revision, stage, _Swap(layout, layout.backup(revision)),
                    smoke_prompt, smoke_tokens, timeout, grpc_options, revisions)
        try:
            smoke = _run(d, previous, rollback, beside)
        finally:
            client.close()
            if not d.keep_stage:
                shutil.rmtree(stage.path, ignore_errors=True)
        result = DeployResult(name=spec.name, url=url, grpc_url=grpc, server_repo=str(server_repo), models=models,
                              engine_dir=str(layout.engines / spec.name), replaced=d.swap.replaced,
                              backup=str(d.swap.backup) if d.swap.replaced else None, smoke=smoke,
                              seconds=time.perf_counter() - start, strategy="candidate" if beside else "in place",
                              revision=revision, migrated=migrated)
        write_record(Path(out_engines), spec.name, {
            "kind": "deploy", **result.to_dict(), "previous_revisions": revisions,
            "lock": {"digest": digest(_lock), "outputs": _lock.get("outputs")},
            "configs": {m: sha256_file(server_repo / m / "config.pbtxt") for m in models}})
        prune_backups(layout.backups, keep_backups)
    return result


def _run(d: _Deploy, previous: list[str], rollback: bool, beside: bool) -> SmokeResult:
    """Candidate + switch, or in place; every failure ends as one DeployError saying what was undone."""
    if not beside:
        return _run_in_place(d, previous, rollback)
    try:
        smoke = _candidate(d)
    except (_StepFailed, OSError) as exc:
        what = d.failed(exc)
        if not rollback:
            d.keep_stage = True
            raise DeployError(f"{what}; not rolled back (--no-rollback): the candidate "
                              f"({', '.join(d.stage.candidates)}) is left as it failed, the serving version was "
                              "not touched", hint="inspect it, then deploy again (that clears it)") from None
        try:
            d.control("rollback", _clear_candidates, d.client, d.layout.repo, d.stage.candidates, d.timeout)
        except (_StepFailed, OSError) as rb:
            raise DeployError(f"{what}; removing the candidate failed too ({_reason(rb)}); "
                              "the serving version was not touched",
                              hint="check the server log; the next deploy clears the candidate") from None
        raise DeployError(f"{what}; rolled back: the candidate is unloaded and removed, the serving version "
                          f"({', '.join(previous)}) was not touched", hint="see the server log for the cause") from None
    try:
        _switch(d, smoke)
        return smoke
    except (_StepFailed, OSError) as exc:
        what = d.failed(exc)
        if not rollback:
            raise DeployError(f"{what}; not rolled back (--no-rollback); the previous version is in "
                              f"{d.swap.backup}", hint="fix and deploy again, or restore the backup by hand") from None
        try:
            _switch_back(d)
        except (_StepFailed, OSError) as rb:
            raise DeployError(f"{what}; the rollback failed too: {_reason(rb)}",
                              hint="check the server log and its repository by hand") from None
        raise DeployError(f"{what}; rolled back: the previous files are back and the previous version serves "
                          f"({', '.join(previous)})", hint="see the server log for the cause") from None


def _run_in_place(d: _Deploy, previous: list[str], rollback: bool) -> SmokeResult:
    try:
        return _in_place(d)
    except (_StepFailed, OSError) as exc:
        what = d.failed(exc)
        if not rollback:
            where = f"; the previous version is in {d.swap.backup}" if d.swap.replaced else ""
            raise DeployError(f"{what}; not rolled back (--no-rollback){where}",
                              hint="fix and deploy again, or restore the backup by hand") from None
        try:
            _rollback(d.client, d.swap, d.models, previous, d.ensemble, d.url, d.timeout)
        except Exception as rb:  # noqa: BLE001
            rb_msg = rb.message if isinstance(rb, (_StepFailed, TrtspecError)) else _message(rb)
            raise DeployError(f"{what}; the rollback failed too: {rb_msg}",
                              hint="check the server log and its repository by hand") from None
        back = (f"the previous models ({', '.join(previous)}) are loaded again" if previous
                else "no models of it were loaded before, none are now")
        raise DeployError(f"{what}; rolled back: {back}", hint="see the server log for the cause") from None


def _rollback(client: ModelControl, swap: _Swap, models: list[str], previous: list[str], ensemble: str, url: str,
              timeout: float) -> None:
    _unload(client, models, timeout)
    swap.restore()
    if not previous:
        return
    order = ([ensemble] if ensemble in previous else []) + [m for m in previous if m != ensemble]
    for m in order:
        if not client.model_ready(m):
            try:
                client.load(m)
            except Exception as exc:  # noqa: BLE001
                raise _StepFailed("rollback", f"reloading {m!r} failed: {_message(exc)}") from None
    not_ready = [m for m in previous if m not in client.ready(previous)]
    if not_ready:
        raise _StepFailed("rollback", f"{', '.join(not_ready)} not ready after the rollback")
