"""Deploy a built torch-runtime deployment onto an already running Triton server (explicit
model-control mode) without an outage: load the new version beside the serving one, smoke-test it,
switch, and roll back on failure.

    deploy_spec(spec, "localhost:8000", "/srv/model_repository", grpc_url="localhost:8001")

1. Preflight: the build (`model_repository/<name>/` + `engines/<name>/` with a readable lock) exists,
   the server at `url` (HTTP) is live and ready, the gRPC endpoint for the smoke test is known; then
   `<server_repo>/.trtspec-deploy.lock` is taken (one deploy per repository at a time: the candidate
   names below are fixed, so a crashed deploy's leftovers are found and cleared by the next one).
2. Stage: the build's model dirs and its engine dir are copied into `<server_repo>/.trtspec-stage-<rev>/`
   (the directory the server reads its models from). Every model's `engine_dir` parameter becomes
   `.trtspec-engines/<name>` (relative to the repository root, so a mounted volume works) and every
   config gets the parameter `trtspec_revision = <rev>`, so Triton sees a changed model.
3. Candidate (the deployment's ensemble is serving): the four models are staged once more under the
   candidate names `<model>__trtspec_next` (the candidate ensemble's steps are the candidate models,
   which read the engine from the stage dir), loaded beside the serving version, smoke-tested, and
   unloaded again, so that no more than two copies of the generation model are ever loaded.
4. Switch: the staged dirs are renamed in under the serving names (what was there moves to
   `<server_repo>/.trtspec-backup-<rev>/`, kept) and the generation model, pre/postprocessing and the
   ensemble are loaded again. Triton 2.51 loads an already loaded model whose files and config changed
   beside the old instance and switches when the new one is ready; requests in flight on the old one
   finish there (measured under traffic: no failed request). A failed reload keeps the old instance
   serving, yet `load_model(ensemble)` reports success even when a step failed to reload, so each step
   is loaded on its own, then the served configs must all carry the new revision and one greedy
   request through the serving ensemble must return the candidate's smoke text.
5. Failure (unless `rollback=False`): before the switch only candidate names were touched: they are
   unloaded and removed; the serving version never changed. During the switch: the backup moves back
   and the models are loaded again (again beside the running ones). A DeployError says what failed and
   what was rolled back.

When nothing of the deployment serves (a first deploy), or with `candidate=False` (for a server
without memory for a second copy), the models are replaced in place instead: swap the files, unload
the deployment, load its ensemble, smoke-test the serving names, and on failure restore the backup
and reload what was ready before. Requests fail while the deployment is unloaded.

Triton 2.51 cannot load an ensemble whose steps were sent with `load_model(files=...)`, so the files
go through the server's repository directory, never over the API.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trtspec.artifacts.fs import digest, read_json, sha256_file, write_json
from trtspec.errors import DeployError, TrtspecError
from trtspec.names import check_name
from trtspec.serve.control import REVISION_PARAM, ModelControl
from trtspec.spec import Spec
from trtspec.state import read_state, state_dir

ENGINES_SUBDIR = ".trtspec-engines"
BACKUP_PREFIX = ".trtspec-backup-"
STAGE_PREFIX = ".trtspec-stage-"
LOCK_FILE = ".trtspec-deploy.lock"
CANDIDATE_SUFFIX = "__trtspec_next"
DEFAULT_SMOKE_PROMPT = "def main():\n    "
KEEP_BACKUPS = 3                       # .trtspec-backup-* dirs kept in a server repository after a deploy
RECORDS_DIR = ".deployments"           # <engines>/.deployments/<name>/<revision>.json (see records_dir)


@dataclasses.dataclass
class SmokeResult:
    prompt: str
    text: str                          # greedy, the deployment's K
    text_plain: str                    # greedy, num_draft_tokens = 0
    identical: bool
    new_tokens: int
    ttft_seconds: float | None
    seconds: float
    acceptance_rate: float
    tokens_per_step: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class DeployResult:
    name: str
    url: str                           # HTTP endpoint the models were loaded through
    grpc_url: str                      # gRPC endpoint of the smoke test
    server_repo: str
    models: list[str]                  # models ready after the deploy (ensemble first)
    engine_dir: str                    # the staged engine dir inside server_repo
    replaced: list[str]                # dirs (relative to server_repo) that held a previous version
    backup: str | None                 # where those previous versions are kept (None: nothing replaced)
    smoke: SmokeResult | None
    seconds: float
    strategy: str                      # "candidate": beside the serving version; "in place": unload, then load
    revision: str                      # the trtspec_revision parameter of the deployed configs

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["smoke"] = self.smoke.to_dict() if self.smoke else None
        return d


class _StepFailed(Exception):
    def __init__(self, step: str, message: str):
        super().__init__(message)
        self.step = step
        self.message = message


# --------------------------------------------------------------------------------------------
# Preflight
# --------------------------------------------------------------------------------------------


def _http_url(url: str) -> str:
    from trtspec.client.remote import normalize_url

    try:
        return normalize_url(url)
    except TrtspecError:
        raise DeployError(f"bad server address {url!r}", hint="pass --url HOST:HTTP_PORT (Triton's HTTP port)") from None


def _check_server(url: str) -> None:
    try:
        health = ModelControl(url, timeout=5.0)
        live = health.live()
    except Exception:  # noqa: BLE001 - refused, unreachable, not HTTP
        raise DeployError(f"cannot reach Triton at {url}",
                          hint="start the server in explicit model-control mode or fix --url HOST:HTTP_PORT") from None
    with health:
        if not live or not health.server_ready():
            raise DeployError(f"Triton at {url} is not live and ready", hint="check the server log")


def _find_build(spec: Spec, out_repo: Path, out_engines: Path) -> tuple[Path, Path, dict[str, Any], list[str]]:
    """(repo dir, engine dir, lock, model names with the ensemble first) of the spec's build."""
    from trtspec.builders.lock import read_lock

    hint = f"trtspec build -c {spec.source or 'SPEC'}"
    repo_dir = Path(out_repo).resolve() / spec.name
    engine_dir = Path(out_engines).resolve() / spec.name
    ensemble = spec.serving.ensemble_name
    if not (repo_dir / ensemble / "config.pbtxt").is_file():
        raise DeployError(f"no built model repository for {spec.name!r} at {repo_dir}", hint=hint)
    lock = read_lock(engine_dir) if engine_dir.is_dir() else None
    if not lock:
        raise DeployError(f"no readable build lock in {engine_dir} (missing or broken build)", hint=hint)
    if lock.get("runtime", spec.runtime.kind) != spec.runtime.kind:  # (locks before the key were torch builds)
        raise DeployError(f"{engine_dir} holds a {lock.get('runtime')!r} build, not a {spec.runtime.kind!r} one",
                          hint=hint)
    names = dict((lock.get("repository") or {}).get("models") or {})
    models = [ensemble] + [n for role, n in names.items() if role != "ensemble" and n != ensemble]
    if len(models) == 1:  # an old lock without names: every model dir of the build
        models += sorted(p.name for p in repo_dir.iterdir()
                         if (p / "config.pbtxt").is_file() and p.name != ensemble)
    missing = [m for m in models if not (repo_dir / m / "config.pbtxt").is_file()]
    if missing:
        raise DeployError(f"the build in {repo_dir} lacks model(s) {', '.join(missing)}", hint=hint)
    return repo_dir, engine_dir, lock, models


def resolve_grpc_url(url: str, grpc_url: str | None, spec: Spec | None = None) -> str:
    """`grpc_url`, else the HTTP host of `url` with the gRPC port of the `trtspec serve` server whose
    HTTP port is `url`'s (its state file), else a DeployError asking for --grpc-url."""
    from trtspec.client.remote import normalize_url
    from trtspec.serve.background import running_state
    from trtspec.serve.server import pid_alive

    if grpc_url:
        try:
            return normalize_url(grpc_url)
        except TrtspecError:
            raise DeployError(f"bad gRPC address {grpc_url!r}", hint="pass --grpc-url HOST:GRPC_PORT") from None
    host, _, port = url.rpartition(":")
    states = [running_state(spec.name)] if spec is not None else []
    for path in sorted(state_dir().glob("serve-*.json")):
        state = read_state(path)
        if state and isinstance(state.get("pid"), int) and pid_alive(state["pid"]):
            states.append(state)
    for state in states:
        if state and str(state.get("http_port")) == port and state.get("grpc_port"):
            return f"{host}:{state['grpc_port']}"
    raise DeployError(f"cannot tell the gRPC port of the server at {url} (no `trtspec serve` state for it)",
                      hint="pass --grpc-url HOST:GRPC_PORT for the smoke test")


# --------------------------------------------------------------------------------------------
# Staging and file swaps
# --------------------------------------------------------------------------------------------


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}-{time.monotonic_ns() % 1_000_000:06d}"


def candidate_name(model: str) -> str:
    """The name a model of the new version is loaded under beside the serving one (one path component)."""
    return check_name(f"{model}{CANDIDATE_SUFFIX}", f"candidate name of model {model!r}", DeployError)


def _rewrite_config(model_dir: Path, engine_param: str, revision: str, rename: dict[str, str] | None = None) -> None:
    """Point the model at its engine dir and stamp the revision (a changed config: Triton reloads it);
    with `rename` (a candidate) the model takes its dir's name and the ensemble's steps are renamed."""
    from trtspec.repository import pbtxt

    config = pbtxt.read_config(model_dir / "config.pbtxt")
    if "engine_dir" in config.parameters:
        config.parameters["engine_dir"].string_value = engine_param
    config.parameters[REVISION_PARAM].string_value = revision
    if rename:
        config.name = model_dir.name
        for step in config.ensemble_scheduling.step:
            step.model_name = rename.get(step.model_name, step.model_name)
    pbtxt.write_config(model_dir, config)


@dataclasses.dataclass
class _Stage:
    path: Path                         # <server_repo>/.trtspec-stage-<rev>/
    items: list[str]                   # what goes in under the serving names (model dirs, then the engine dir)
    candidates: list[str]              # candidate model dirs (empty: in place), ensemble first


def _stage(repo_dir: Path, engine_dir: Path, models: list[str], server_repo: Path, name: str, revision: str,
           candidates: bool) -> _Stage:
    """Copy the build into a temp dir inside server_repo (and its candidate models, when asked)."""
    stage = server_repo / f"{STAGE_PREFIX}{revision}"
    engine_rel = f"{ENGINES_SUBDIR}/{name}"
    rename = {m: candidate_name(m) for m in models} if candidates else {}
    try:
        for model in models:
            shutil.copytree(repo_dir / model, stage / model)
            _rewrite_config(stage / model, engine_rel, revision)
            if candidates:
                shutil.copytree(repo_dir / model, stage / rename[model])
                _rewrite_config(stage / rename[model], f"{stage.name}/{engine_rel}", revision, rename)
        shutil.copytree(engine_dir, stage / engine_rel)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return _Stage(stage, models + [engine_rel], [rename[m] for m in models] if candidates else [])


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _deploy_lock(server_repo: Path) -> Iterator[None]:
    """One deploy per server repository at a time (flock; released when the process dies)."""
    import fcntl

    fd = os.open(server_repo / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise DeployError(f"another deploy into {server_repo} is running (it holds {LOCK_FILE})",
                              hint="wait for it to finish: deploys to one server repository run one at a time"
                              ) from None
        yield
    finally:
        os.close(fd)


@dataclasses.dataclass
class _Swap:
    server_repo: Path
    backup: Path
    done: list[tuple[str, bool]] = dataclasses.field(default_factory=list)  # (rel path, had a previous one)

    def swap_in(self, stage: Path, items: list[str]) -> None:
        for rel in items:
            final = self.server_repo / rel
            final.parent.mkdir(parents=True, exist_ok=True)
            had = final.exists() or final.is_symlink()
            if had:
                (self.backup / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(final, self.backup / rel)
            self.done.append((rel, had))
            os.replace(stage / rel, final)

    def restore(self) -> None:
        for rel, had in reversed(self.done):
            final = self.server_repo / rel
            if final.exists() or final.is_symlink():
                trash = self.server_repo / f"{STAGE_PREFIX}trash-{_stamp()}"
                os.replace(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            if had:
                os.replace(self.backup / rel, final)
        self.done.clear()
        shutil.rmtree(self.backup, ignore_errors=True)

    @property
    def replaced(self) -> list[str]:
        return [rel for rel, had in self.done if had]


# --------------------------------------------------------------------------------------------
# Model control
# --------------------------------------------------------------------------------------------


def _message(exc: Exception, limit: int = 400) -> str:
    """One line; a Python backend's traceback (" At: <file>(<line>) ...") is cut off (it is in the log)."""
    text = exc.message() if callable(getattr(exc, "message", None)) else str(exc)
    text = " ".join((text or type(exc).__name__).split()).split(" At: ")[0].rstrip(" ;")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _revision(client: ModelControl, model: str) -> str | None:
    """The trtspec_revision of the config `model` is served with (None: no such parameter)."""
    params = client.config(model).get("parameters") or {}
    return (params.get(REVISION_PARAM) or {}).get("string_value")


def _unload(client: ModelControl, models: list[str], timeout: float) -> None:
    """Unload the models that are loaded (or loading) and wait until none is READY or UNLOADING."""
    state = client.index()
    for m in models:
        if state.get(m) in ("READY", "LOADING", "UNAVAILABLE"):
            try:
                client.unload(m)
            except Exception as exc:
                if state.get(m) == "READY":
                    raise _StepFailed("unload", f"unloading {m!r} failed: {_message(exc)}") from None
    busy = client.wait_unloaded(models, timeout)
    if busy:
        raise _StepFailed("unload", f"model(s) {', '.join(busy)} still loaded {timeout:.0f}s after unloading")


def _load(client: ModelControl, ensemble: str, models: list[str], url: str) -> list[str]:
    try:
        client.load(ensemble)
    except Exception as exc:
        raise _StepFailed("load", f"loading {ensemble!r} into {url} failed: {_message(exc)}") from None
    not_ready = [m for m in models if m not in client.ready(models)]
    if not_ready:
        raise _StepFailed("load", f"model(s) {', '.join(not_ready)} not ready on {url} after loading {ensemble!r}")
    return models


def _reload(client: ModelControl, models: list[str], expected: dict[str, str | None], url: str, step: str) -> None:
    """Load the deployment again so that every model serves the config revision `expected[model]`.

    One load of the ensemble (`models[0]`) makes Triton reload its changed steps together, each beside
    its running instance, switching each when its new one is ready. It reports success even when a step
    failed to reload (that step keeps its old instance), so a step still at another revision is then
    loaded on its own, which fails with that step's error."""
    def stale() -> list[str]:
        return [m for m in models if not client.model_ready(m) or _revision(client, m) != expected.get(m)]

    def load(model: str) -> None:
        try:
            client.load(model)
        except Exception as exc:  # noqa: BLE001
            raise _StepFailed(step, f"reloading {model!r} on {url} failed: {_message(exc)}") from None

    load(models[0])
    left = stale()
    for m in left:
        load(m)
    left = left and stale()
    if left:
        raise _StepFailed(step, f"model(s) {', '.join(left)} do not serve revision "
                                f"{', '.join(sorted({str(expected.get(m)) for m in left}))} after reloading "
                                "(the server log says why)")


def _forget_failed(client: ModelControl, names: list[str]) -> None:
    """Triton 2.51 reports the whole server not ready (strict readiness: a load balancer would stop
    sending it traffic) while a model's last load failed, even once it is unloaded and its files are
    gone, until a load under that name succeeds. So each failed name among `names` gets a minimal
    Python model (no torch: about a second) loaded in its place, to be unloaded with the rest."""
    import json

    failed = [m.get("name") for m in client.entries() if m.get("name") in names
              and m.get("state") == "UNAVAILABLE" and m.get("reason") not in (None, "", "unloaded")]
    for name in failed:
        config = {"name": name, "backend": "python", "max_batch_size": 0,
                  "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
                  "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
                  "instance_group": [{"count": 1, "kind": "KIND_CPU"}]}
        client.load(name, config=json.dumps(config), files={"file:1/model.py": _PLACEHOLDER_PY})


_PLACEHOLDER_PY = b"class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"


def _clear_candidates(client: ModelControl, server_repo: Path, candidates: list[str], timeout: float) -> None:
    """Unload and remove candidate models (this deploy's, or a dead deploy's: under the deploy lock no
    other deploy owns them), leaving none in a failed state."""
    _forget_failed(client, candidates)
    _unload(client, candidates, timeout)
    for name in candidates:
        _remove(server_repo / name)


def smoke_test(grpc_url: str, prompt: str, *, model: str, max_tokens: int = 32, timeout: float = 120.0,
               grpc_options=None) -> SmokeResult:
    """Greedy with the deployment's K and with no speculation: both non-empty and identical
    (`grpc_options`: TLS and headers, trtspec.client.remote.GrpcOptions)."""
    from trtspec.client.remote import generate_remote

    try:
        spec_run = generate_remote(grpc_url, prompt, max_tokens=max_tokens, model=model, timeout=timeout,
                                   options=grpc_options)
        plain = generate_remote(grpc_url, prompt, max_tokens=max_tokens, model=model, num_draft_tokens=0,
                                timeout=timeout, options=grpc_options)
    except TrtspecError as exc:
        raise _StepFailed("smoke test", f"smoke request to {grpc_url} failed: {exc.message}") from None
    result = SmokeResult(prompt=prompt, text=spec_run.text, text_plain=plain.text,
                         identical=spec_run.text == plain.text, new_tokens=spec_run.new_tokens,
                         ttft_seconds=spec_run.ttft_seconds, seconds=spec_run.seconds,
                         acceptance_rate=spec_run.acceptance_rate, tokens_per_step=spec_run.tokens_per_step)
    if not spec_run.text or not plain.text:
        raise _StepFailed("smoke test", "smoke test returned empty text")
    if not result.identical:
        raise _StepFailed("smoke test", f"speculative and plain greedy outputs differ "
                                        f"({spec_run.text[:40]!r} vs {plain.text[:40]!r})")
    return result


# --------------------------------------------------------------------------------------------
# The deploy
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Deploy:
    """What one deploy works with (see deploy_spec)."""

    spec: Spec
    url: str
    grpc: str
    server_repo: Path
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
                                    f"is {self.server_repo} the directory it serves?")

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
            os.replace(d.stage.path / name, d.server_repo / name)
        d.control("load", d.listed, names[0], "load")
        d.control("load", _load, d.client, names[0], names, d.url)
        smoke = d.smoke(names[0])
        d.control("unload", _clear_candidates, d.client, d.server_repo, names, d.timeout)
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
) -> DeployResult:
    """Deploy the spec's torch build onto the running server at `url` (HTTP HOST:PORT, explicit
    model-control mode) whose model repository is `server_repo`; see the module docstring.
    `admin_key` opens the server's restricted model-repository API; `grpc_options` (TLS, headers)
    are for the smoke test. `candidate=False` replaces a serving version in place (an outage, but
    never two copies of the model in memory). A successful deploy writes its record (records_dir) and keeps the
    newest `keep_backups` backups in server_repo (rollback needs the newest)."""
    start = time.perf_counter()
    url = _http_url(url)
    repo_dir, engine_dir, _lock, models = _find_build(spec, Path(out_repo), Path(out_engines))
    server_repo = Path(server_repo).resolve()
    if not server_repo.is_dir():
        raise DeployError(f"server repository {server_repo} is not a directory",
                          hint="pass --server-repo DIR: the model repository the running server reads")
    _check_server(url)
    grpc = resolve_grpc_url(url, grpc_url, spec)
    candidates = [candidate_name(m) for m in models]

    with _deploy_lock(server_repo):
        try:
            client = ModelControl(url, admin_key, timeout)
            previous = client.ready(models)
            revisions = {m: _revision(client, m) for m in previous}
            _clear_candidates(client, server_repo, candidates, timeout)
        except Exception as exc:  # noqa: BLE001 - any client failure is a deploy failure
            raise DeployError(f"cannot control models on {url}: "
                              f"{exc.message if isinstance(exc, _StepFailed) else _message(exc)}",
                              hint="check --url and the admin key (--admin-key)") from None
        for stale in server_repo.glob(f"{STAGE_PREFIX}*"):  # a dead deploy's (we hold the lock)
            _remove(stale)
        beside = candidate and models[0] in previous
        revision = _stamp()
        try:
            stage = _stage(repo_dir, engine_dir, models, server_repo, spec.name, revision, beside)
        except OSError as exc:
            client.close()
            raise DeployError(f"cannot stage the build into {server_repo}: {exc}",
                              hint="--server-repo must be writable and have room for the engines") from None
        d = _Deploy(spec, url, grpc, server_repo, models, client, revision, stage,
                    _Swap(server_repo, server_repo / f"{BACKUP_PREFIX}{revision}"),
                    smoke_prompt, smoke_tokens, timeout, grpc_options, revisions)
        try:
            smoke = _run(d, previous, rollback, beside)
        finally:
            client.close()
            if not d.keep_stage:
                shutil.rmtree(stage.path, ignore_errors=True)
        result = DeployResult(name=spec.name, url=url, grpc_url=grpc, server_repo=str(server_repo), models=models,
                              engine_dir=str(server_repo / ENGINES_SUBDIR / spec.name), replaced=d.swap.replaced,
                              backup=str(d.swap.backup) if d.swap.replaced else None, smoke=smoke,
                              seconds=time.perf_counter() - start, strategy="candidate" if beside else "in place",
                              revision=revision)
        write_record(Path(out_engines), spec.name, {
            "kind": "deploy", **result.to_dict(), "previous_revisions": revisions,
            "lock": {"digest": digest(_lock), "outputs": _lock.get("outputs")},
            "configs": {m: sha256_file(server_repo / m / "config.pbtxt") for m in models}})
        prune_backups(server_repo, keep_backups)
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
            d.control("rollback", _clear_candidates, d.client, d.server_repo, d.stage.candidates, d.timeout)
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


# --------------------------------------------------------------------------------------------
# Records, backups, rollback
# --------------------------------------------------------------------------------------------


def records_dir(out_engines: Path, name: str) -> Path:
    """Where a deployment's records live: `<engines>/.deployments/<name>/`, beside the build output
    `<engines>/<name>/` rather than in it (the build lock hashes every file there and a rebuild replaces the
    directory whole)."""
    return Path(out_engines).resolve() / RECORDS_DIR / check_name(name, "deployment name", DeployError)


def write_record(out_engines: Path, name: str, record: dict[str, Any]) -> Path:
    """One JSON record per deploy or rollback, named by its revision (sortable by time), written atomically."""
    record = {"format": 1, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}
    path = records_dir(out_engines, name) / f"{record['revision']}.json"
    write_json(path, record)
    return path


def read_records(out_engines: Path, name: str, server_repo: Path | None = None) -> list[dict[str, Any]]:
    """The records, oldest first (unreadable files skipped); only those for `server_repo` when given."""
    folder = records_dir(out_engines, name)
    out = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        rec = read_json(path)
        if isinstance(rec, dict) and rec.get("revision") and (
                server_repo is None or rec.get("server_repo") == str(Path(server_repo).resolve())):
            out.append({**rec, "_path": str(path)})
    return out


def prune_backups(server_repo: Path, keep: int) -> list[str]:
    """Remove all but the newest `keep` backup dirs (names sort by time); returns the removed ones."""
    backups = sorted(p for p in Path(server_repo).glob(f"{BACKUP_PREFIX}*") if p.is_dir())
    gone = backups[:max(0, len(backups) - max(keep, 1))]
    for p in gone:
        _remove(p)
    return [p.name for p in gone]


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

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["smoke"] = self.smoke.to_dict() if self.smoke else None
        return d


def rollback_spec(spec: Spec, url: str, server_repo: str | Path, *, grpc_url: str | None = None,
                  out_engines: str | Path = "engines", timeout: float = 300.0, admin_key: str | None = None,
                  grpc_options=None, smoke_prompt: str = DEFAULT_SMOKE_PROMPT, smoke_tokens: int = 32
                  ) -> RollbackResult:
    """Roll the deployment on the server at `url` back to the version before its newest deploy record: that
    record's backup moves back under the serving names (what served moves to a new backup), each model is
    loaded again beside its running instance, and a greedy smoke request (speculative = plain) must pass.
    Only the newest record not yet rolled back, and only while it is what serves. On failure the files
    swap back and the models reload (a DeployError says what happened). Rolling back again goes one record
    further back, while its backup is kept (KEEP_BACKUPS)."""
    start = time.perf_counter()
    url = _http_url(url)
    server_repo = Path(server_repo).resolve()
    records = [r for r in read_records(Path(out_engines), spec.name, server_repo)
               if r.get("kind") == "deploy" and not r.get("rolled_back")]
    hint = f"records are kept by `trtspec deploy` under {records_dir(Path(out_engines), spec.name)}"
    if not records:
        raise DeployError(f"no deploy of {spec.name!r} to {server_repo} to roll back", hint=hint)
    rec = records[-1]
    backup = Path(rec["backup"]) if rec.get("backup") else None
    if backup is None or not backup.is_dir() or not rec.get("replaced"):
        raise DeployError(f"the newest deploy of {spec.name!r} ({rec['revision']}) replaced nothing, or its backup "
                          f"is gone: there is no previous version to roll back to", hint=hint)
    models, items = list(rec["models"]), list(rec["replaced"])
    _check_server(url)
    grpc = resolve_grpc_url(url, grpc_url, spec)
    with _deploy_lock(server_repo):
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
            kept = server_repo / f"{BACKUP_PREFIX}{revision}"
            moved: list[str] = []
            try:
                for rel in items:  # what serves -> the new backup; the previous version -> the serving names
                    (kept / rel).parent.mkdir(parents=True, exist_ok=True)
                    os.replace(server_repo / rel, kept / rel)
                    os.replace(backup / rel, server_repo / rel)
                    moved.append(rel)
                _reload(client, models, target, url, "rollback")
                smoke = smoke_test(grpc, smoke_prompt, model=models[0], max_tokens=smoke_tokens, timeout=timeout,
                                   grpc_options=grpc_options)
            except (_StepFailed, OSError, Exception) as exc:  # noqa: BLE001 - undo, then say what failed
                why = exc.message if isinstance(exc, _StepFailed) else _message(exc)
                try:
                    for rel in reversed(moved):
                        os.replace(server_repo / rel, backup / rel)
                        os.replace(kept / rel, server_repo / rel)
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
                                time.perf_counter() - start)
        write_record(Path(out_engines), spec.name, {"kind": "rollback", "revision": revision, **result.to_dict()})
    return result
