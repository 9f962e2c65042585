"""Generate from a Triton server over gRPC (the ensemble of a trtspec or tensorrtllm_backend repository).

The ensemble is decoupled (its generation model streams), so both streaming and non-streaming
requests go over the gRPC bidirectional stream: `stream=False` asks for one response carrying
the whole text. Every failure (connection refused, timeout, a server-side error such as a bad
request) becomes a ClientError with one clear line.
"""

from __future__ import annotations

import dataclasses
import queue
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from trtspec.errors import ClientError

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
    def tokens_per_step(self) -> float | None:
        """Tokens per verify step; the first token comes from the prefill, not from a step."""
        return (self.new_tokens - 1) / self.steps if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.update(tokens_per_second=self.tokens_per_second, tokens_per_step=self.tokens_per_step,
                 drafted=self.total_draft_tokens, accepted=self.total_accepted_draft_tokens)
        return d


def normalize_url(url: str) -> str:
    """'grpc://host:port', 'host:port' or ':port' -> 'host:port' (what tritonclient expects)."""
    url = url.strip()
    for prefix in ("grpc://", "http://", "https://"):
        if url.startswith(prefix):
            url = url[len(prefix):]
    url = url.rstrip("/")
    if url.startswith(":"):
        url = "localhost" + url
    if ":" not in url:
        raise ClientError(f"bad server address {url!r}", hint="use HOST:PORT of Triton's gRPC endpoint, e.g. localhost:8001")
    return url


def resolve_url(url: str | None, config: str | None = None) -> str:
    """`url` if given, else the gRPC endpoint of the server `trtspec serve` started for the spec at
    `config`, else localhost and the spec's serving.grpc_port."""
    if url:
        return normalize_url(url)
    from trtspec.serve.state import read_state, state_path
    from trtspec.spec import load_spec

    spec = load_spec(config or "trtspec.toml")
    state = read_state(state_path(spec.name))
    if state and state.get("grpc_url"):
        return normalize_url(state["grpc_url"])
    if spec.serving.grpc_port:
        return f"localhost:{spec.serving.grpc_port}"
    raise ClientError(f"no running server recorded for {spec.name!r} and serving.grpc_port is 0",
                      hint="start one with `trtspec serve`, or pass --url HOST:PORT")


def _message(exc: Exception) -> str:
    text = exc.message() if callable(getattr(exc, "message", None)) else str(exc)
    return " ".join((text or type(exc).__name__).split())


def _connection_error(url: str, exc: Exception) -> ClientError:
    text = _message(exc)
    if "connect" in text.lower() or "unavailable" in text.lower():
        return ClientError(f"cannot reach Triton at {url}: connection refused",
                           hint="start the server (`trtspec serve`) or check --url HOST:PORT (the gRPC port)")
    return ClientError(f"Triton at {url}: {text}")


def _inputs(prompt: str, max_tokens: int, stream: bool, temperature: float, top_k: int, top_p: float,
            seed: int | None, num_draft_tokens: int | None, stop: Sequence[str]) -> list:
    import numpy as np
    import tritonclient.grpc as grpcclient

    def make(name: str, value: Any, dtype: str, np_dtype: Any) -> Any:
        array = np.array([value if isinstance(value, list) else [value]], dtype=np_dtype)
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        return tensor

    inputs = [
        make("text_input", prompt.encode("utf-8"), "BYTES", np.object_),
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
) -> RemoteResult:
    """Send one prompt to the ensemble `model` at `url` (HOST:PORT of Triton's gRPC endpoint).

    With `stream`, `on_text` is called with each piece of text as it arrives (without it, once
    with the whole text). `num_draft_tokens=None` uses the deployment's K, 0 disables speculation.
    `timeout` bounds the whole request. Raises ClientError on any failure."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    url = normalize_url(url)
    inputs = _inputs(prompt, max_tokens, stream, temperature, top_k, top_p, seed, num_draft_tokens, stop)
    try:
        client = grpcclient.InferenceServerClient(url)
    except InferenceServerException as exc:
        raise _connection_error(url, exc) from None
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
            raise _connection_error(url, exc) from None
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
                raise ClientError(f"server error: {_message(error)}")
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
