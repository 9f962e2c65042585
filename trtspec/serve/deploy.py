"""Deploy a built torch-runtime deployment onto an already running Triton server (explicit
model-control mode), smoke-test it, and roll back on failure.

    deploy_spec(spec, "localhost:8000", "/srv/model_repository", grpc_url="localhost:8001")

1. Preflight: the build (`model_repository/<name>/` + `engines/<name>/` with a readable lock) exists,
   the server at `url` (HTTP) is live and ready, the gRPC endpoint for the smoke test is known.
2. Stage: the build's model dirs and its engine dir are copied into a temp dir inside `server_repo`
   (the directory the server reads its models from); the engine dir goes to
   `<server_repo>/.trtspec-engines/<name>/` and every model's `engine_dir` parameter is rewritten to
   that relative path (it resolves against the repository root, so a mounted volume works). Then each
   dir is swapped in with a rename; what was there before moves to `<server_repo>/.trtspec-backup-<ts>/`.
3. Load: the deployment's models are unloaded if loaded (Triton ignores a load of new files with an
   unchanged config), then the ensemble is loaded (Triton loads its steps).
4. Smoke test over gRPC: one greedy prompt with the deployment's K and with `num_draft_tokens=0`;
   both must be non-empty and identical (speculation is lossless).
5. On a failure in 3-4 (unless `rollback=False`): the deployment's models are unloaded, the backup
   dirs are moved back, the models that were ready before are loaded again and checked ready, and a
   DeployError says what failed and that it rolled back.

Triton 2.51 cannot load an ensemble whose steps were sent with `load_model(files=...)`, so the files
go through the server's repository directory, never over the API.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
import urllib.parse
from pathlib import Path
from typing import Any

from trtspec.errors import DeployError, TrtspecError
from trtspec.spec import Spec

ENGINES_SUBDIR = ".trtspec-engines"
BACKUP_PREFIX = ".trtspec-backup-"
STAGE_PREFIX = ".trtspec-stage-"
DEFAULT_SMOKE_PROMPT = "def main():\n    "
ENGINE_DIR_PARAM_MODELS = ("preprocessing", "generation", "postprocessing")


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
    from trtspec.serve.server import _http_status

    live = _http_status(f"http://{url}/v2/health/live", timeout=5.0)
    if live is None:
        raise DeployError(f"cannot reach Triton at {url}",
                          hint="start the server in explicit model-control mode or fix --url HOST:HTTP_PORT")
    if live != 200 or _http_status(f"http://{url}/v2/health/ready", timeout=5.0) != 200:
        raise DeployError(f"Triton at {url} is not live and ready", hint="check the server log")


def _find_build(spec: Spec, out_repo: Path, out_engines: Path) -> tuple[Path, Path, dict[str, Any], list[str]]:
    """(repo dir, engine dir, lock, model names with the ensemble first) of the spec's build."""
    from trtspec.build.lock import read_lock

    hint = f"trtspec build -c {spec.source or 'SPEC'}"
    if spec.runtime.kind != "torch":
        raise DeployError(f"deploy supports runtime 'torch' only, not {spec.runtime.kind!r}",
                          hint="deploy trtllm repositories with the Triton TRT-LLM container's tooling")
    repo_dir = Path(out_repo).resolve() / spec.name
    engine_dir = Path(out_engines).resolve() / spec.name
    ensemble = spec.serving.ensemble_name
    if not (repo_dir / ensemble / "config.pbtxt").is_file():
        raise DeployError(f"no built model repository for {spec.name!r} at {repo_dir}", hint=hint)
    lock = read_lock(engine_dir) if engine_dir.is_dir() else None
    if not lock:
        raise DeployError(f"no readable build lock in {engine_dir} (missing or broken build)", hint=hint)
    if lock.get("runtime", "torch") != "torch":
        raise DeployError(f"{engine_dir} holds a {lock.get('runtime')!r} build, not a torch one", hint=hint)
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
    from trtspec.serve import running_state
    from trtspec.serve.server import pid_alive
    from trtspec.serve.state import read_state, state_dir

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


def _rewrite_engine_dir(model_dir: Path, engine_param: str) -> None:
    from trtspec.repository import pbtxt

    config = pbtxt.read_config(model_dir / "config.pbtxt")
    if "engine_dir" in config.parameters:
        config.parameters["engine_dir"].string_value = engine_param
        pbtxt.write_config(model_dir, config)


def _stage(repo_dir: Path, engine_dir: Path, models: list[str], server_repo: Path, name: str) -> tuple[Path, list[str]]:
    """Copy the build into a temp dir inside server_repo; returns it and the relative paths staged."""
    stage = server_repo / f"{STAGE_PREFIX}{_stamp()}"
    engine_rel = f"{ENGINES_SUBDIR}/{name}"
    try:
        for model in models:
            shutil.copytree(repo_dir / model, stage / model)
            _rewrite_engine_dir(stage / model, engine_rel)
        shutil.copytree(engine_dir, stage / engine_rel)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return stage, models + [engine_rel]


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


def _client(url: str, timeout: float, admin_key: str | None = None):
    """HTTP client for model control; every call carries the server's admin key (its model-repository
    API is restricted: see trtspec.serve.server)."""
    import tritonclient.http as httpclient

    from trtspec.client.remote import HeaderPlugin
    from trtspec.serve.server import admin_headers

    client = httpclient.InferenceServerClient(url, connection_timeout=timeout, network_timeout=timeout)
    if admin_key:
        client.register_plugin(HeaderPlugin(admin_headers(admin_key, "http")))
    return client


def _message(exc: Exception, limit: int = 400) -> str:
    """One line; a Python backend's traceback (" At: <file>(<line>) ...") is cut off (it is in the log)."""
    text = exc.message() if callable(getattr(exc, "message", None)) else str(exc)
    text = " ".join((text or type(exc).__name__).split()).split(" At: ")[0].rstrip(" ;")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _index(client) -> dict[str, str]:
    return {m.get("name"): m.get("state", "") for m in client.get_model_repository_index()}


def _ready(client, models: list[str]) -> list[str]:
    out = []
    for m in models:
        try:
            if client.is_model_ready(m):
                out.append(m)
        except Exception:
            pass
    return out


def _unload(client, models: list[str], timeout: float) -> None:
    """Unload the models that are loaded (or loading) and wait until none is READY or UNLOADING."""
    state = _index(client)
    for m in models:
        if state.get(m) in ("READY", "LOADING", "UNAVAILABLE"):
            try:
                client.unload_model(m)
            except Exception as exc:
                if state.get(m) == "READY":
                    raise _StepFailed("unload", f"unloading {m!r} failed: {_message(exc)}") from None
    deadline = time.monotonic() + timeout
    while True:
        state = _index(client)
        busy = [m for m in models if state.get(m) in ("READY", "UNLOADING", "LOADING")]
        if not busy:
            return
        if time.monotonic() > deadline:
            raise _StepFailed("unload", f"model(s) {', '.join(busy)} still loaded {timeout:.0f}s after unloading")
        time.sleep(0.1)


def _load(client, ensemble: str, models: list[str], url: str) -> list[str]:
    try:
        client.load_model(ensemble)
    except Exception as exc:
        raise _StepFailed("load", f"loading {ensemble!r} into {url} failed: {_message(exc)}") from None
    not_ready = [m for m in models if m not in _ready(client, models)]
    if not_ready:
        raise _StepFailed("load", f"model(s) {', '.join(not_ready)} not ready on {url} after loading {ensemble!r}")
    return models


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
) -> DeployResult:
    """Deploy the spec's torch build onto the running server at `url` (HTTP HOST:PORT, explicit
    model-control mode) whose model repository is `server_repo`; see the module docstring.
    `admin_key` opens the server's restricted model-repository API; `grpc_options` (TLS, headers)
    are for the smoke test."""
    start = time.perf_counter()
    url = _http_url(url)
    repo_dir, engine_dir, _lock, models = _find_build(spec, Path(out_repo), Path(out_engines))
    ensemble = models[0]
    server_repo = Path(server_repo).resolve()
    if not server_repo.is_dir():
        raise DeployError(f"server repository {server_repo} is not a directory",
                          hint="pass --server-repo DIR: the model repository the running server reads")
    _check_server(url)
    grpc = resolve_grpc_url(url, grpc_url, spec)

    try:
        client = _client(url, timeout, admin_key)
        previous = _ready(client, models)
    except Exception as exc:  # noqa: BLE001 - any client failure is a deploy failure
        raise DeployError(f"cannot query models on {url}: {_message(exc)}", hint="check --url") from None

    try:
        stage, items = _stage(repo_dir, engine_dir, models, server_repo, spec.name)
    except OSError as exc:
        client.close()
        raise DeployError(f"cannot stage the build into {server_repo}: {exc}",
                          hint="--server-repo must be writable and have room for the engines") from None
    swap = _Swap(server_repo, server_repo / f"{BACKUP_PREFIX}{_stamp()}")
    smoke = None
    try:
        try:
            swap.swap_in(stage, items)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        try:
            if ensemble not in _index(client):
                raise _StepFailed("load", f"the server at {url} does not list {ensemble!r} in its repository: "
                                          f"is {server_repo} the directory it serves?")
            _unload(client, models, timeout)
            _load(client, ensemble, models, url)
        except _StepFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - connection errors etc.
            raise _StepFailed("load", f"model control on {url} failed: {_message(exc)}") from None
        smoke = smoke_test(grpc, smoke_prompt, model=ensemble, max_tokens=smoke_tokens, timeout=timeout,
                           grpc_options=grpc_options)
    except (_StepFailed, OSError) as exc:
        step = exc.step if isinstance(exc, _StepFailed) else "stage"
        message = exc.message if isinstance(exc, _StepFailed) else str(exc)
        what = f"deploying {spec.name!r} to {url} failed at the {step}: {message}"
        try:
            if not rollback:
                where = f"; the previous version is in {swap.backup}" if swap.replaced else ""
                raise DeployError(f"{what}; not rolled back (--no-rollback){where}",
                                  hint="fix and deploy again, or restore the backup by hand") from None
            try:
                _rollback(client, swap, models, previous, ensemble, url, timeout)
            except Exception as rb:  # noqa: BLE001
                rb_msg = rb.message if isinstance(rb, (_StepFailed, TrtspecError)) else _message(rb)
                raise DeployError(f"{what}; the rollback failed too: {rb_msg}",
                                  hint="check the server log and its repository by hand") from None
            back = (f"the previous models ({', '.join(previous)}) are loaded again" if previous
                    else "no models of it were loaded before, none are now")
            raise DeployError(f"{what}; rolled back: {back}", hint="see the server log for the cause") from None
        finally:
            client.close()
    client.close()
    return DeployResult(name=spec.name, url=url, grpc_url=grpc, server_repo=str(server_repo), models=models,
                        engine_dir=str(server_repo / ENGINES_SUBDIR / spec.name), replaced=swap.replaced,
                        backup=str(swap.backup) if swap.replaced else None, smoke=smoke,
                        seconds=time.perf_counter() - start)


def _rollback(client, swap: _Swap, models: list[str], previous: list[str], ensemble: str, url: str,
              timeout: float) -> None:
    _unload(client, models, timeout)
    swap.restore()
    if not previous:
        return
    order = ([ensemble] if ensemble in previous else []) + [m for m in previous if m != ensemble]
    for m in order:
        if m not in _ready(client, [m]):
            try:
                client.load_model(m)
            except Exception as exc:  # noqa: BLE001
                raise _StepFailed("rollback", f"reloading {m!r} failed: {_message(exc)}") from None
    not_ready = [m for m in previous if m not in _ready(client, previous)]
    if not_ready:
        raise _StepFailed("rollback", f"{', '.join(not_ready)} not ready after the rollback")
