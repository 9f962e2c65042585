"""Generate from a Triton server over gRPC (the ensemble of a trtspec or tensorrtllm_backend repository).

The ensemble is decoupled (its generation model streams), so both streaming and non-streaming
requests go over the gRPC bidirectional stream: `stream=False` asks for one response carrying
the whole text. Every failure (connection refused, timeout, a server-side error such as a bad
request) becomes a ClientError with one clear line.

Addresses keep their scheme: `HOST:PORT` and `grpc://HOST:PORT` are plaintext, `grpcs://` and
`https://` are TLS (never silently downgraded). `GrpcOptions` carries TLS material (`ssl`, root
certificates, a client key and certificate chain for mutual TLS) and extra headers (e.g. for an
auth proxy), sent with every call.
"""

from __future__ import annotations

import dataclasses
import queue
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trtspec.errors import ClientError
from trtspec.runtime.stats import tokens_per_step

DEFAULT_MODEL = "ensemble"


@dataclasses.dataclass
class RemoteResult:
    """Text and stats of one remote generation."""

    text: str
    new_tokens: int                    # tokens generated (server count)
    seconds: float                     # request sent -> final response
    ttft_seconds: float | None         # request sent -> first non-empty text
    acceptance_rate: float             # accepted / drafted draft tokens of this request
    total_draft_tokens: int
    total_accepted_draft_tokens: int
    steps: int                         # verify steps after the prefill (0 if the server does not say)
    responses: int                     # responses received
    url: str = ""
    model: str = DEFAULT_MODEL

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        """As trtspec.runtime.stats defines it: the first token comes from the prefill, not from a step
        (0.0 with no step, or from a server that does not count steps)."""
        return tokens_per_step(max(0, self.new_tokens - 1), self.steps)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(tokens_per_second=self.tokens_per_second, tokens_per_step=self.tokens_per_step,
                 drafted=self.total_draft_tokens, accepted=self.total_accepted_draft_tokens)
        return d


PLAIN_SCHEMES = ("grpc", "http")
TLS_SCHEMES = ("grpcs", "https")


def parse_url(url: str) -> tuple[str | None, str]:
    """(scheme or None, 'host:port') of 'grpcs://host:port', 'host:port' or ':port'."""
    url = url.strip()
    scheme = None
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", url)
    if match:
        scheme = match.group(1).lower()
        if scheme not in PLAIN_SCHEMES + TLS_SCHEMES:
            raise ClientError(f"unknown scheme {scheme!r} in {url!r}",
                              hint="use HOST:PORT or grpc:// (plaintext), grpcs:// or https:// (TLS)")
        url = url[match.end():]
    url = url.rstrip("/")
    if url.startswith(":"):
        url = "localhost" + url
    if ":" not in url or not url.rpartition(":")[2].isdigit():
        raise ClientError(f"bad server address {url!r}", hint="use HOST:PORT of Triton's gRPC endpoint, e.g. localhost:8001")
    return scheme, url


def normalize_url(url: str) -> str:
    """'grpc://host:port', 'host:port' or ':port' -> 'host:port' (what tritonclient expects), for callers
    that speak plaintext only: a TLS address is refused rather than silently downgraded."""
    scheme, hostport = parse_url(url)
    if scheme in TLS_SCHEMES:
        raise ClientError(f"{url!r} asks for TLS, which this call does not speak",
                          hint="pass HOST:PORT; for gRPC over TLS use `trtspec generate --url grpcs://...`")
    return hostport


@dataclasses.dataclass(frozen=True)
class GrpcOptions:
    """How to talk to a gRPC endpoint: TLS (`ssl`, PEM files: the CA to trust, and a client key and
    certificate chain for mutual TLS) and headers sent with every call (names are lower-cased: gRPC
    metadata keys are)."""

    ssl: bool = False
    root_certs: str | None = None
    private_key: str | None = None
    certificate_chain: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def make(cls, *, ssl: bool = False, root_certs: str | None = None, private_key: str | None = None,
             certificate_chain: str | None = None, headers: Mapping[str, str] | Sequence[str] = ()) -> "GrpcOptions":
        """From CLI-style values: `headers` as {name: value} or ["NAME=VALUE", ...]."""
        pairs = []
        for item in (headers.items() if isinstance(headers, Mapping) else headers):
            if isinstance(item, str):
                name, sep, value = item.partition("=")
                if not sep:
                    raise ClientError(f"bad header {item!r}", hint="pass headers as NAME=VALUE")
            else:
                name, value = item
            name = name.strip().lower()
            if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", name) or name.startswith("grpc-"):
                raise ClientError(f"bad header name {name!r}",
                                  hint="letters, digits, '-', '_' and '.'; not a reserved grpc-* name")
            if any(c in value for c in "\r\n\0"):
                raise ClientError(f"bad value for header {name!r}: no line breaks")
            pairs.append((name, value))
        return cls(ssl, root_certs, private_key, certificate_chain, tuple(pairs))

    @property
    def tls_material(self) -> bool:
        return any((self.root_certs, self.private_key, self.certificate_chain))


class HeaderPlugin:
    """A tritonclient plugin that adds fixed headers to every request (client.register_plugin)."""

    def __init__(self, headers: Mapping[str, str]):
        self.headers = dict(headers)

    def __call__(self, request) -> None:
        request.headers = {**(request.headers or {}), **self.headers}


def use_tls(url: str, options: GrpcOptions | None) -> tuple[str, bool]:
    """('host:port', TLS?) for `url` with `options`; a ClientError for a contradiction, never a silent
    plaintext fallback: grpcs:// / https:// are TLS; HOST:PORT is TLS with --ssl or TLS files; an
    explicit grpc:// with TLS options is refused."""
    options = options or GrpcOptions()
    scheme, hostport = parse_url(url)
    wants = options.ssl or options.tls_material
    if scheme in PLAIN_SCHEMES and wants:
        raise ClientError(f"{url!r} is plaintext ({scheme}://) but TLS options were given",
                          hint="use grpcs://HOST:PORT (or a bare HOST:PORT) for TLS, or drop --ssl/--root-certs")
    tls = scheme in TLS_SCHEMES or wants
    if bool(options.private_key) != bool(options.certificate_chain):
        raise ClientError("mutual TLS needs both --private-key and --certificate-chain",
                          hint="pass the client's certificate chain (PEM) with its key, or neither for one-way TLS")
    for what, path in (("root certificates", options.root_certs), ("private key", options.private_key),
                       ("certificate chain", options.certificate_chain)):
        if path and not Path(path).is_file():
            raise ClientError(f"{what} file not found: {path}", hint="pass a PEM file")
    return hostport, tls


def grpc_client(url: str, options: GrpcOptions | None = None):
    """(tritonclient.grpc client, 'host:port', TLS?) for `url` (see `use_tls`), with `options.headers`."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    options = options or GrpcOptions()
    hostport, tls = use_tls(url, options)
    try:
        client = grpcclient.InferenceServerClient(
            hostport, ssl=tls, root_certificates=options.root_certs if tls else None,
            private_key=options.private_key if tls else None,
            certificate_chain=options.certificate_chain if tls else None)
    except InferenceServerException as exc:
        raise _connection_error(hostport, exc, tls) from None
    if options.headers:
        client.register_plugin(HeaderPlugin(dict(options.headers)))
    return client, hostport, tls


def resolve_url(url: str | None, config: str | None = None) -> str:
    """`url` if given (its scheme kept: grpcs:// stays TLS, and an explicit grpc:// stays plaintext, so that
    `use_tls` refuses it with --ssl rather than trying TLS), else the gRPC endpoint of the server
    `trtspec serve` started for the spec at `config` (grpcs:// when it serves TLS), else localhost and
    the spec's serving.grpc_port."""
    if url:
        scheme, hostport = parse_url(url)
        return f"{scheme}://{hostport}" if scheme else hostport
    from trtspec.state import read_state, state_path
    from trtspec.spec import load_spec

    spec = load_spec(config or "trtspec.toml")
    state = read_state(state_path(spec.name))
    if state and state.get("grpc_url"):
        hostport = normalize_url(state["grpc_url"])
        return f"grpcs://{hostport}" if state.get("grpc_tls") else hostport
    if spec.serving.grpc_port:
        return f"localhost:{spec.serving.grpc_port}"
    raise ClientError(f"no running server recorded for {spec.name!r} and serving.grpc_port is 0",
                      hint="start one with `trtspec serve`, or pass --url HOST:PORT")


def _message(exc: Exception) -> str:
    text = exc.message() if callable(getattr(exc, "message", None)) else str(exc)
    return " ".join((text or type(exc).__name__).split())


def _connection_error(url: str, exc: Exception, tls: bool = False) -> ClientError:
    text = _message(exc)
    low = text.lower()
    if tls and any(w in low for w in ("ssl", "handshake", "certificate", "tls")):
        return ClientError(f"TLS to Triton at {url} failed: {text[:200]}",
                           hint="check --root-certs (the CA that signed the server's certificate, which must name "
                                "the host you connect to) and that the server speaks TLS")
    if "connect" in low or "unavailable" in low or "socket closed" in low:
        what = "TLS connection failed" if tls else "connection refused"
        return ClientError(f"cannot reach Triton at {url}: {what}",
                           hint="start the server (`trtspec serve`) or check --url HOST:PORT (the gRPC port); "
                                + ("a plaintext server needs a plain HOST:PORT" if tls
                                   else "a TLS server needs grpcs://HOST:PORT or --ssl"))
    return ClientError(f"Triton at {url}: {text}")


def _server_error(error: Exception) -> ClientError:
    """A request the server answered with an error: the server's one line, and what to do about it."""
    text = _message(error)
    if "internal error" in text or "generation failed" in text:
        hint = "not the request's fault: the server's log has the traceback (`trtspec serve` prints its path)"
    elif "shutting down" in text:
        hint = "the server is stopping (drain or unload): retry once it serves again"
    else:
        hint = ("the server refused the request as sent: change what the message names (the deployment's "
                "limits are its spec's [limits]; `trtspec generate --help` lists the request flags)")
    return ClientError(f"server error: {text}", hint=hint)


def _inputs(prompt: str, max_tokens: int, stream: bool, temperature: float, top_k: int, top_p: float,
            seed: int | None, num_draft_tokens: int | None, stop: Sequence[str], messages: Any = None,
            task: str | None = None) -> list:
    import numpy as np
    import tritonclient.grpc as grpcclient

    def make(name: str, value: Any, dtype: str, np_dtype: Any) -> Any:
        array = np.array([value if isinstance(value, list) else [value]], dtype=np_dtype)
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        return tensor

    import json

    text = ("messages", json.dumps(list(messages))) if messages is not None else ("text_input", prompt)
    inputs = [
        make(text[0], text[1].encode("utf-8"), "BYTES", np.object_),
        make("max_tokens", max_tokens, "INT32", np.int32),
        make("stream", bool(stream), "BOOL", np.bool_),
        make("temperature", temperature, "FP32", np.float32),
        make("top_k", top_k, "INT32", np.int32),
        make("top_p", top_p, "FP32", np.float32),
    ]
    if seed is not None:
        inputs.append(make("seed", seed, "UINT64", np.uint64))
    if num_draft_tokens is not None:
        inputs.append(make("num_draft_tokens", num_draft_tokens, "INT32", np.int32))
    if stop:
        inputs.append(make("stop_words", [s.encode("utf-8") for s in stop], "BYTES", np.object_))
    if task is not None:
        inputs.append(make("task", task.encode("utf-8"), "BYTES", np.object_))
    return inputs


def _scalar(result: Any, name: str, default: Any = 0) -> Any:
    try:
        value = result.as_numpy(name)
    except Exception:  # an output the server does not have
        return default
    return default if value is None or value.size == 0 else value.reshape(-1)[0].item()


def generate_remote(
    url: str,
    prompt: str,
    *,
    max_tokens: int = 128,
    stream: bool = True,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    num_draft_tokens: int | None = None,
    stop: Sequence[str] = (),
    timeout: float = 120.0,
    on_text: Callable[[str], None] | None = None,
    model: str = DEFAULT_MODEL,
    options: GrpcOptions | None = None,
    messages: Sequence[dict[str, str]] | None = None,
    task: str | None = None,
) -> RemoteResult:
    """Send one prompt to the ensemble `model` at `url` (Triton's gRPC endpoint: HOST:PORT, or
    grpcs://HOST:PORT for TLS; `options` for TLS material and headers).

    With `stream`, `on_text` is called with each piece of text as it arrives (without it, once
    with the whole text). `num_draft_tokens=None` uses the deployment's K, 0 disables speculation.
    `timeout` bounds the whole request. `messages` ([{"role", "content"}, ...]) sends a chat instead of
    `prompt`, which the server renders with its tokenizer's chat template. `task` picks the drafter of a routed
    deployment (none: its router decides). Raises ClientError on any failure."""
    from tritonclient.utils import InferenceServerException

    inputs = _inputs(prompt, max_tokens, stream, temperature, top_k, top_p, seed, num_draft_tokens, stop, messages,
                     task)
    client, url, tls = grpc_client(url, options)
    responses: queue.Queue = queue.Queue()

    def callback(result, error):  # tritonclient passes these by keyword: the names matter
        responses.put((result, error))

    pieces: list[str] = []
    stats = {"tokens": 0, "drafted": 0, "accepted": 0, "rate": 0.0, "steps": 0}
    count, ttft, completed = 0, None, False
    start = time.perf_counter()
    deadline = start + timeout
    try:
        try:
            if not client.is_server_live(client_timeout=min(timeout, 10.0)):
                raise ClientError(f"Triton at {url} is not live", hint="check the server log")
            client.start_stream(callback=callback)
            client.async_stream_infer(model, inputs, request_id=uuid.uuid4().hex, enable_empty_final_response=True)
        except InferenceServerException as exc:
            raise _connection_error(url, exc, tls) from None
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise ClientError(f"no complete answer from {url} within {timeout:g}s",
                                  hint="raise --timeout, or lower --max-tokens")
            try:
                result, error = responses.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if error is not None:
                completed = True  # an error ends the request (it is its final response): nothing to cancel
                if count == 0 and tls:  # a TLS failure shows up as the stream's first error
                    raise _connection_error(url, error, tls)
                raise _server_error(error)
            count += 1
            text_out = None
            try:
                text_out = result.as_numpy("text_output")
            except Exception:
                pass
            if text_out is not None:  # (the empty final response has no outputs)
                piece = b"".join(x if isinstance(x, bytes) else str(x).encode() for x in text_out.reshape(-1))
                piece = piece.decode("utf-8", errors="replace")
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - start
                    pieces.append(piece)
                    if on_text is not None and stream:
                        on_text(piece)
                stats.update(tokens=_scalar(result, "num_output_tokens"), drafted=_scalar(result, "total_draft_tokens"),
                             accepted=_scalar(result, "total_accepted_draft_tokens"),
                             rate=_scalar(result, "acceptance_rate", 0.0), steps=_scalar(result, "num_steps"))
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                completed = True
                break
    finally:
        try:  # cancel only an unfinished request (cancelling a finished one leaks it in Triton 2.51's ensembles)
            client.stop_stream(cancel_requests=not completed)
        except Exception:
            pass
        client.close()
    seconds = time.perf_counter() - start
    text = "".join(pieces)
    if on_text is not None and not stream:
        on_text(text)
    return RemoteResult(text=text, new_tokens=int(stats["tokens"]), seconds=seconds, ttft_seconds=ttft,
                        acceptance_rate=float(stats["rate"]), total_draft_tokens=int(stats["drafted"]),
                        total_accepted_draft_tokens=int(stats["accepted"]), steps=int(stats["steps"]),
                        responses=count, url=url, model=model)
