"""One model-control client for a running Triton server: tritonclient's HTTP client, every call carrying
the server's admin key (its model-repository API is restricted: trtspec.repository.server_flags).

`serve` (load_models / unload_models), `deploy` (candidate load, switch, rollback), the drain before a
stop and the readiness wait of a starting server all talk to the server through it, so the key, the
timeouts and what "ready" means are decided once. Failures are tritonclient's own exceptions (or the
connection's): each caller words them for its own step.

    with ModelControl("127.0.0.1:8000", admin_key=key) as control:
        control.load("ensemble")
        control.wait_unloaded(["ensemble"], timeout=60)
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from trtspec.errors import ServeError
from trtspec.repository.server_flags import admin_headers

LOADED = ("READY", "UNLOADING", "LOADING")  # states of a model that is not (yet) gone


class ModelControl:
    """A tritonclient HTTP client on `url` (HOST:PORT) with the admin key, a context manager. `timeout`
    bounds connecting and every call (an unreachable server fails instead of hanging)."""

    def __init__(self, url: str, admin_key: str | None = None, timeout: float = 60.0):
        import tritonclient.http as httpclient

        from trtspec.client.remote import HeaderPlugin

        self.url = url
        self.client = httpclient.InferenceServerClient(url, connection_timeout=timeout, network_timeout=timeout)
        if admin_key:
            self.client.register_plugin(HeaderPlugin(admin_headers(admin_key, "http")))

    def close(self) -> None:
        """Close the connection: an open keep-alive connection would hold Triton's exit."""
        self.client.close()

    def __enter__(self) -> ModelControl:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- health --------------------------------------------------------------------------------

    def live(self) -> bool:
        """Whether the server answers live (raises when it cannot be reached at all)."""
        return bool(self.client.is_server_live())

    def server_ready(self) -> bool:
        try:
            return bool(self.client.is_server_ready())
        except Exception:  # noqa: BLE001 - not listening yet, or gone: not ready
            return False

    def model_ready(self, model: str) -> bool:
        try:
            return bool(self.client.is_model_ready(model))
        except Exception:  # noqa: BLE001
            return False

    def ready(self, models: Iterable[str]) -> list[str]:
        """The models of `models` that are ready, in their order."""
        return [m for m in models if self.model_ready(m)]

    # -- the repository ------------------------------------------------------------------------

    def entries(self) -> list[dict[str, Any]]:
        """The repository index as Triton gives it (name, version, state, reason)."""
        return list(self.client.get_model_repository_index())

    def index(self) -> dict[str, str]:
        """{model: state} of every model in the repository."""
        return {m.get("name"): m.get("state", "") for m in self.entries()}

    def config(self, model: str) -> dict[str, Any]:
        return self.client.get_model_config(model)

    def load(self, model: str, config: str | None = None, files: dict[str, bytes] | None = None) -> None:
        self.client.load_model(model, config=config, files=files)

    def unload(self, model: str, unload_dependents: bool = False) -> None:
        self.client.unload_model(model, unload_dependents=unload_dependents)

    def wait_unloaded(self, models: list[str], timeout: float, poll: float = 0.1) -> list[str]:
        """Wait until none of `models` is READY, UNLOADING or LOADING; returns those still so at `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.index()
            busy = [m for m in models if state.get(m) in LOADED]
            if not busy or time.monotonic() > deadline:
                return busy
            time.sleep(poll)


_CONTROL_HINT = ("the server must run in explicit model-control mode, have the model in its repository, and be "
                 "given its admin key (admin_key=..., `--admin-key`, $TRTSPEC_ADMIN_KEY)")


def _control(url: str, admin_key: str | None) -> ModelControl:
    """ModelControl on `url` (normalized) with `admin_key`, by default the key of the `trtspec serve` server
    on that port."""
    from trtspec.client.remote import normalize_url
    from trtspec.serve.background import admin_key_for

    return ModelControl(normalize_url(url), admin_key or admin_key_for(url))


def load_models(url: str, models: Iterable[str], *, reload: bool = False, admin_key: str | None = None) -> list[str]:
    """Load `models` from the model repository of the running server at `url` (HTTP HOST:PORT),
    which must run with `--model-control-mode=explicit` (as `TritonServer` does by default); its
    model-repository API takes `admin_key` (`TritonServer.admin_key`; default: the key of the
    `trtspec serve` server on that port). Loading an ensemble loads its steps too, so
    `load_models(url, ["ensemble"])` brings a whole deployment up. `reload` unloads a loaded model
    first (for new files with an unchanged config, which Triton's load would otherwise ignore).
    Returns the models now ready."""
    from tritonclient.utils import InferenceServerException

    loaded = []
    with _control(url, admin_key) as control:
        for name in models:
            try:
                if reload and control.client.is_model_ready(name):
                    control.unload(name)
                control.load(name)
            except InferenceServerException as exc:
                raise ServeError(f"loading {name!r} into {url} failed: {exc.message()}", hint=_CONTROL_HINT) from None
            if not control.client.is_model_ready(name):
                raise ServeError(f"{name!r} is not ready on {url} after loading", hint="see the server log")
            loaded.append(name)
    return loaded


def unload_models(url: str, models: Iterable[str], unload_dependents: bool = False,
                  admin_key: str | None = None) -> None:
    """Unload `models` from a running server (explicit mode, `admin_key` as in `load_models`); with
    `unload_dependents`, an ensemble's steps too (also when other ensembles use them)."""
    from tritonclient.utils import InferenceServerException

    with _control(url, admin_key) as control:
        for name in models:
            try:
                control.unload(name, unload_dependents=unload_dependents)
            except InferenceServerException as exc:
                raise ServeError(f"unloading {name!r} from {url} failed: {exc.message()}", hint=_CONTROL_HINT) from None
