"""Preflight of a deploy: the server address, a live and ready server, the spec's build, the gRPC port."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.errors import DeployError, TrtspecError
from trtspec.serve.control import ModelControl
from trtspec.spec import Spec
from trtspec.state import read_state, state_dir


def _http_url(url: str) -> str:
    from trtspec.client.remote import normalize_url

    try:
        return normalize_url(url)
    except TrtspecError:
        raise DeployError(f"bad server address {url!r}",
                          hint="pass --url HOST:HTTP_PORT (Triton's HTTP port)") from None


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
