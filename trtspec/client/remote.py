"""Generate from a Triton server over gRPC (the ensemble of a trtspec or tensorrtllm_backend repository).

The ensemble is decoupled (its generation model streams), so both streaming and non-streaming
requests go over the gRPC bidirectional stream: `stream=False` asks for one response carrying
the whole text. Every failure (connection refused, timeout, a server-side error such as a bad
request) becomes a ClientError with one clear line. The address, TLS and headers: client/connect.py.
"""

from __future__ import annotations

import dataclasses
import json
import queue
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from trtspec.client.connect import (
    GrpcOptions,
    connection_error,
    error_text,
    grpc_client,
    normalize_url,  # noqa: F401  (serve/deploy/preflight.py imports it from here)
)
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


@dataclasses.dataclass
class _Answer:
    """What the responses of one request add up to, as they arrive."""

    start: float                       # time.perf_counter() when the request was sent
    pieces: list[str] = dataclasses.field(default_factory=list)
    stats: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"tokens": 0, "drafted": 0, "accepted": 0, "rate": 0.0, "steps": 0})
    responses: int = 0
    ttft: float | None = None
    completed: bool = False            # the final response (or an error) came: nothing left to cancel

    def add(self, result: Any) -> str:
        """Take one response: its text piece ("" when it has none) and the stats it carries."""
        self.responses += 1
        piece = ""
        text_out = None
        try:
            text_out = result.as_numpy("text_output")
        except Exception:
            pass
        if text_out is not None:  # (the empty final response has no outputs)
            raw = b"".join(x if isinstance(x, bytes) else str(x).encode() for x in text_out.reshape(-1))
            piece = raw.decode("utf-8", errors="replace")
            if piece:
                if self.ttft is None:
                    self.ttft = time.perf_counter() - self.start
                self.pieces.append(piece)
            self.stats.update(tokens=_scalar(result, "num_output_tokens"),
                              drafted=_scalar(result, "total_draft_tokens"),
                              accepted=_scalar(result, "total_accepted_draft_tokens"),
                              rate=_scalar(result, "acceptance_rate", 0.0), steps=_scalar(result, "num_steps"))
        final = result.get_response().parameters.get("triton_final_response")
        if final is not None and final.bool_param:
            self.completed = True
        return piece

    def result(self, url: str, model: str) -> RemoteResult:
        s = self.stats
        return RemoteResult(text="".join(self.pieces), new_tokens=int(s["tokens"]),
                            seconds=time.perf_counter() - self.start, ttft_seconds=self.ttft,
                            acceptance_rate=float(s["rate"]), total_draft_tokens=int(s["drafted"]),
                            total_accepted_draft_tokens=int(s["accepted"]), steps=int(s["steps"]),
                            responses=self.responses, url=url, model=model)


def _server_error(error: Exception) -> ClientError:
    """A request the server answered with an error: the server's one line, and what to do about it."""
    text = error_text(error)
    if "internal error" in text or "generation failed" in text:
        hint = "not the request's fault: the server's log has the traceback (`trtspec serve` prints its path)"
    elif "shutting down" in text:
        hint = "the server is stopping (drain or unload): retry once it serves again"
    else:
        hint = ("the server refused the request as sent: change what the message names (the deployment's "
                "limits are its spec's [limits]; `trtspec generate --help` lists the request flags)")
    return ClientError(f"server error: {text}", hint=hint)


def _inputs(prompt: str, messages: Any, *, max_tokens: int, stream: bool, temperature: float, top_k: int,
            top_p: float, seed: int | None, num_draft_tokens: int | None, stop: Sequence[str],
            task: str | None) -> list:
    """The ensemble's input tensors: `messages` (a chat, as JSON) when given, else `prompt`."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    def make(name: str, value: Any, dtype: str, np_dtype: Any) -> Any:
        array = np.array([value if isinstance(value, list) else [value]], dtype=np_dtype)
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        return tensor

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


def _send(client: Any, url: str, tls: bool, model: str, inputs: list, timeout: float,
          responses: queue.Queue) -> None:
    """Open the stream and send the request; its responses (or its error) arrive on `responses`."""
    from tritonclient.utils import InferenceServerException

    def callback(result, error):  # tritonclient passes these by keyword: the names matter
        responses.put((result, error))

    try:
        if not client.is_server_live(client_timeout=min(timeout, 10.0)):
            raise ClientError(f"Triton at {url} is not live", hint="check the server log")
        client.start_stream(callback=callback)
        client.async_stream_infer(model, inputs, request_id=uuid.uuid4().hex, enable_empty_final_response=True)
    except InferenceServerException as exc:
        raise connection_error(url, exc, tls) from None


def _next(responses: queue.Queue, deadline: float, url: str, timeout: float) -> tuple[Any, Any]:
    """The next (result, error) of the stream; a ClientError once the request's deadline has passed."""
    while True:
        left = deadline - time.perf_counter()
        if left <= 0:
            raise ClientError(f"no complete answer from {url} within {timeout:g}s",
                              hint="raise --timeout, or lower --max-tokens")
        try:
            return responses.get(timeout=min(left, 0.5))
        except queue.Empty:
            continue


def _close(client: Any, cancel: bool) -> None:
    try:  # cancel only an unfinished request (cancelling a finished one leaks it in Triton 2.51's ensembles)
        client.stop_stream(cancel_requests=cancel)
    except Exception:
        pass
    client.close()


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
    inputs = _inputs(prompt, messages, max_tokens=max_tokens, stream=stream, temperature=temperature, top_k=top_k,
                     top_p=top_p, seed=seed, num_draft_tokens=num_draft_tokens, stop=stop, task=task)
    client, url, tls = grpc_client(url, options)
    responses: queue.Queue = queue.Queue()
    answer = _Answer(start=time.perf_counter())
    try:
        _send(client, url, tls, model, inputs, timeout, responses)
        while not answer.completed:
            result, error = _next(responses, answer.start + timeout, url, timeout)
            if error is not None:
                answer.completed = True  # an error ends the request (it is its final response): nothing to cancel
                if answer.responses == 0 and tls:  # a TLS failure shows up as the stream's first error
                    raise connection_error(url, error, tls)
                raise _server_error(error)
            piece = answer.add(result)
            if piece and on_text is not None and stream:
                on_text(piece)
    finally:
        _close(client, cancel=not answer.completed)
    remote = answer.result(url, model)
    if on_text is not None and not stream:
        on_text(remote.text)
    return remote
