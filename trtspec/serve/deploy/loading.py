"""Model control for a deploy: load, unload and reload through the server's repository API, each failure one line."""

from __future__ import annotations

from pathlib import Path

from trtspec.serve.control import REVISION_PARAM, ModelControl
from trtspec.serve.deploy.layout import _remove


class _StepFailed(Exception):
    def __init__(self, step: str, message: str):
        super().__init__(message)
        self.step = step
        self.message = message


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
