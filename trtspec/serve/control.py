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

import math
import time
from collections.abc import Iterable
from typing import Any

from trtspec.errors import ServeError
from trtspec.repository.server_flags import admin_headers
from trtspec.runtime.stats import acceptance_rate, tokens_per_step

LOADED = ("READY", "UNLOADING", "LOADING")  # states of a model that is not (yet) gone
REVISION_PARAM = "trtspec_revision"  # config parameter: the deploy revision a model was loaded from


class ModelControl:
    """A tritonclient HTTP client on `url` (HOST:PORT) with the admin key, a context manager. `timeout`
    bounds connecting and every call (an unreachable server fails instead of hanging)."""

    def __init__(self, url: str, admin_key: str | None = None, timeout: float = 60.0):
        import tritonclient.http as httpclient

        from trtspec.client.connect import HeaderPlugin

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
    from trtspec.client.connect import normalize_url
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


# -- status ------------------------------------------------------------------------------------

def scrape(metrics_url: str, timeout: float = 10.0) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text endpoint as (name, labels, value), through prometheus_client's parser."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    if not metrics_url.startswith(("http://", "https://")):
        metrics_url = f"http://{metrics_url}"
    with urllib.request.urlopen(metrics_url, timeout=timeout) as r:  # noqa: S310 - http(s) only, checked above
        text = r.read().decode("utf-8", errors="replace")
    return [(s.name, dict(s.labels), float(s.value)) for fam in text_string_to_metric_families(text)
            for s in fam.samples]


UNDER_LOAD = {"spec_dec_shared_acceptance": "shared_acceptance",  # sample name -> key of "under_load"
              "spec_dec_priced_off_requests_total": "priced_off_requests"}


def spec_metrics(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, dict[str, Any]]:
    """At a glance, per label `model`: for a generation model's spec_dec_* families (labelled with the
    deployment's name and method) requests, tokens, acceptance, tokens per step and per-position acceptance
    (definitions as trtspec.runtime.stats), its cost table ("costs": verify seconds by rows, draft seconds
    by drafter, and by drafter and batch size where measured) and per drafter what prices it under load
    ("under_load": its shared acceptance, None until known, and the new requests priced off at their batch); for
    Triton's nv_inference_* families (labelled with Triton's model names) inferences, failures and the average
    queue time."""
    raw: dict[str, dict[str, Any]] = {}
    for name, labels, value in samples:
        if name.startswith("nv_") and name.endswith("_total"):
            name = name[:-len("_total")]  # prometheus_client names every counter sample *_total; Triton does not
        model = labels.get("model")
        if not model:
            continue
        m = raw.setdefault(model, {"per_position": {}})
        if name.startswith("spec_dec_drafter_") and "drafter" in labels:  # a routed spec: per drafter
            d = m.setdefault("drafters", {}).setdefault(labels["drafter"], {})
            d[name] = d.get(name, 0.0) + value
        elif name == "spec_dec_verify_cost_seconds" and labels.get("rows", "").isdigit():  # the cost table
            m.setdefault("verify_cost", {})[int(labels["rows"])] = value
        elif name == "spec_dec_draft_cost_seconds" and "drafter" in labels:
            m.setdefault("draft_cost", {})[labels["drafter"]] = value
        elif name == "spec_dec_draft_batch_cost_seconds" and "drafter" in labels and labels.get("batch", "").isdigit():
            m.setdefault("draft_batch_cost", {}).setdefault(labels["drafter"], {})[int(labels["batch"])] = value
        elif name in UNDER_LOAD and "drafter" in labels:  # each drafter's shared acceptance (runtime/adaptive.py)
            m.setdefault("under_load", {}).setdefault(labels["drafter"], {})[UNDER_LOAD[name]] = value
        elif name == "spec_dec_accepted_tokens_per_position_total" and labels.get("position", "").isdigit():
            m["per_position"][int(labels["position"])] = m["per_position"].get(int(labels["position"]), 0.0) + value
        elif name.startswith(("spec_dec_", "nv_inference_")):
            m[name] = m.get(name, 0.0) + value
            if "method" in labels:
                m["method"] = labels["method"]
    out = {}
    for model, m in raw.items():
        row: dict[str, Any] = {"method": m.get("method")}
        if "spec_dec_requests_total" in m:
            req, gen, steps = (m.get(k, 0.0) for k in ("spec_dec_requests_total", "spec_dec_generated_tokens_total",
                                                         "spec_dec_steps_total"))
            drafts = m.get("spec_dec_drafts_total", 0.0)
            row |= {"requests": int(req), "generated_tokens": int(gen),
                    "failures": int(m.get("spec_dec_request_failures_total", 0.0)),
                    "acceptance_rate": acceptance_rate(m.get("spec_dec_accepted_tokens_total", 0.0),
                                                       m.get("spec_dec_draft_tokens_total", 0.0)),
                    "tokens_per_step": tokens_per_step(max(0.0, gen - req), steps),
                    "per_position_acceptance": [m["per_position"].get(i, 0.0) / drafts
                                                for i in range(max(m["per_position"], default=-1) + 1)]
                    if drafts else []}
        if m.get("drafters"):
            row["drafters"] = {name: _drafter_row(d) for name, d in sorted(m["drafters"].items())}
        if m.get("verify_cost"):  # the engine's cost table (runtime/costs.py)
            row["costs"] = {"verify": dict(sorted(m["verify_cost"].items())), "draft": m.get("draft_cost", {})}
            if m.get("draft_batch_cost"):
                row["costs"]["draft_by_batch"] = {d: dict(sorted(by.items()))
                                                  for d, by in m["draft_batch_cost"].items()}
        if m.get("under_load"):
            row["under_load"] = {d: {"shared_acceptance": None if math.isnan(v.get("shared_acceptance", math.nan))
                                     else v["shared_acceptance"],
                                     "priced_off_requests": int(v.get("priced_off_requests", 0.0))}
                                 for d, v in sorted(m["under_load"].items())}
        if "nv_inference_request_success" in m:
            ok = m["nv_inference_request_success"]
            row |= {"inferences": int(ok), "inference_failures": int(m.get("nv_inference_request_failure", 0.0)),
                    "avg_queue_us": m.get("nv_inference_queue_duration_us", 0.0) / ok if ok else 0.0}
        out[model] = row
    return out


def _drafter_row(d: dict[str, float]) -> dict[str, Any]:
    """One drafter of a routed deployment: its steps, tokens and acceptance (spec_dec_drafter_* families)."""
    steps = d.get("spec_dec_drafter_steps_total", 0.0)
    drafted, accepted = (d.get("spec_dec_drafter_draft_tokens_total", 0.0),
                         d.get("spec_dec_drafter_accepted_tokens_total", 0.0))
    return {"steps": int(steps), "draft_tokens": int(drafted), "accepted_tokens": int(accepted),
            "acceptance_rate": acceptance_rate(accepted, drafted),
            "tokens_per_step": tokens_per_step(d.get("spec_dec_drafter_emitted_tokens_total", 0.0), steps)}


def server_status(url: str, admin_key: str | None = None, models: Iterable[str] = (),
                  metrics_url: str | None = None, timeout: float = 10.0) -> dict[str, Any]:
    """Live/ready, every model with its version, state and readiness (the repository index needs the admin
    key; without it only `models` are asked, through the open readiness API), and the metrics at a glance.
    Raises ServeError when the server cannot be reached."""
    from trtspec.client.connect import normalize_url

    url = normalize_url(url)
    try:
        control = ModelControl(url, admin_key, timeout)
        live = control.live()
    except Exception as exc:  # noqa: BLE001 - refused, unreachable, not HTTP
        raise ServeError(f"cannot reach Triton at {url}: {type(exc).__name__}",
                         hint="pass --url HOST:HTTP_PORT (Triton's HTTP port)") from None
    with control:
        out: dict[str, Any] = {"url": url, "live": live, "ready": control.server_ready(), "index": None}
        rows: dict[str, dict[str, Any]] = {}
        try:
            for e in control.entries():
                rows[e.get("name")] = {"version": e.get("version"), "state": e.get("state"),
                                       "reason": e.get("reason") or None}
            out["index"] = "repository index"
        except Exception as exc:  # noqa: BLE001 - restricted without the key, or not in explicit mode
            out["index"] = f"not readable ({' '.join(str(exc).split())[:120]}): pass --admin-key for every model"
        for m in models:
            rows.setdefault(m, {"version": None, "state": None, "reason": None})
        for name, row in rows.items():
            row["ready"] = control.model_ready(name)
            if row["ready"]:
                try:
                    params = control.config(name).get("parameters") or {}
                    row["revision"] = (params.get(REVISION_PARAM) or {}).get("string_value")
                except Exception:  # noqa: BLE001
                    row["revision"] = None
        out["models"] = rows
    if metrics_url:
        try:
            out["metrics"] = spec_metrics(scrape(metrics_url, timeout))
        except Exception as exc:  # noqa: BLE001 - status still shows the models
            out["metrics"] = None
            out["metrics_error"] = f"{metrics_url}: {' '.join(str(exc).split())[:160]}"
    return out
