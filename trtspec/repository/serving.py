"""Plain-Python pieces of the emitted Python-backend models (no `triton_python_backend_utils`
import here, so they can be unit-tested): parameters, engine-dir resolution, request checks and
the recent-steps gauges of the generation model.

Every request failure leaves a model as one line: a bad request (`RequestError`, the engine's
`GenerationError`) says what to fix and goes back as INVALID_ARG (HTTP 400, gRPC INVALID_ARGUMENT);
anything else is a bug or an engine failure, so the client gets "internal error" and the server log
gets the traceback (tracebacks name files of the server, which clients must not see).
"""

from __future__ import annotations

import json
import math
import os
import threading
import traceback
from collections import deque
from pathlib import Path
from typing import Any

from trtspec.errors import GenerationError
from trtspec.runtime.stats import SpecDecodingStats, acceptance_rate, tokens_per_step

ENGINE_DIR_ENV = "TRTSPEC_ENGINE_DIR"       # overrides the `engine_dir` parameter of every model
ENGINE_SPEC = "spec.json"                    # engines/<name>/spec.json: the spec, paths relative to it


MIN_BYTES_PER_TOKEN = 32   # floor of the prompt byte bound per token (normalizers may drop bytes)


class RequestError(GenerationError):
    """A bad request: the message goes back to that client only."""


def input_array(pb_utils: Any, request: Any, name: str):
    """A request's input `name` as a numpy array, None when the request does not carry it (`pb_utils`: the
    model's triton_python_backend_utils)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def model_parameters(model_config: dict[str, Any]) -> dict[str, str]:
    """`parameters { key: "k" value { string_value: "v" } }` as a plain dict."""
    return {k: v.get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()}


def resolve_engine_dir(model_dir: str | Path, params: dict[str, str]) -> Path:
    """The engine dir: $TRTSPEC_ENGINE_DIR, else the `engine_dir` parameter, which when relative is
    relative to the model repository root (the parent of the model's own directory)."""
    raw = os.environ.get(ENGINE_DIR_ENV) or params.get("engine_dir", "")
    if not raw:
        raise RuntimeError(f"no engine dir: set the model parameter engine_dir or ${ENGINE_DIR_ENV}")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = Path(model_dir).resolve().parent / path
    if not path.is_dir():
        raise RuntimeError(f"engine dir {path} not found (parameter engine_dir={params.get('engine_dir')!r}, "
                           f"${ENGINE_DIR_ENV}={os.environ.get(ENGINE_DIR_ENV)!r})")
    return path.resolve()


def resolve_tokenizer_dir(engine_dir: Path, params: dict[str, str]) -> Path:
    raw = params.get("tokenizer_dir") or "target"
    path = Path(raw).expanduser()
    return path if path.is_absolute() else engine_dir / path


def model_tokenizer(args: dict[str, Any]):
    """(parameters, tokenizer) of a pre/postprocessing model from Triton's `initialize` args."""
    from trtspec.repository import textio

    params = model_parameters(json.loads(args["model_config"]))
    engine_dir = resolve_engine_dir(args["model_repository"], params)
    return params, textio.load_tokenizer(resolve_tokenizer_dir(engine_dir, params))


def load_engine_spec(engine_dir: Path):
    """The Spec stored in the engine dir, its paths pointing at the engine's own role dirs."""
    from trtspec.spec import spec_from_dict

    path = Path(engine_dir) / ENGINE_SPEC
    data = json.loads(path.read_text(encoding="utf-8"))
    return spec_from_dict(data, base=Path(engine_dir), source=path)


def int_param(params: dict[str, str], key: str, default: int) -> int:
    try:
        return int(params.get(key, default))
    except ValueError:
        return default


def require(array: Any, name: str) -> Any:
    """`array`, or a RequestError if the input is missing (Triton 2.51 counts a request's inputs rather
    than naming the required ones, so a missing required input plus an optional one reaches the model)."""
    if array is None:
        raise RequestError(f"input '{name}' is required")
    return array


def scalar(array: Any, name: str, kind: type) -> Any:
    """The single value of a [1] / [1, 1] input, as `kind` (floats must be finite)."""
    if array is None:
        return None
    if array.size != 1:
        raise RequestError(f"input '{name}' must hold one value per request, got shape {list(array.shape)}")
    value = array.reshape(-1)[0]
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    try:
        value = kind(value)
    except (TypeError, ValueError, OverflowError):
        raise RequestError(f"input '{name}' must be {kind.__name__}, got {str(value)[:40]!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise RequestError(f"input '{name}' must be a finite number, got {value}")
    return value


def prompt_byte_limit(max_input_len: int, max_token_bytes: int) -> int:
    """The most UTF-8 bytes a prompt of max_input_len tokens can have, generously: checked before
    tokenizing, so a multi-megabyte prompt is refused at once instead of blocking the model instance
    (and its memory) while it is tokenized only to be refused for its token count."""
    return max_input_len * max(MIN_BYTES_PER_TOKEN, max_token_bytes)


def check_prompt_bytes(n_bytes: int, limit: int, max_input_len: int) -> None:
    if n_bytes > limit:
        raise RequestError(f"the prompt has {n_bytes} bytes, more than the {limit} bytes allowed for "
                           f"max_input_len={max_input_len} tokens")


def check_ids(array: Any, name: str, vocab: int) -> None:
    """Token ids must be integers in [0, vocab)."""
    if array is None or array.size == 0:
        return
    if array.dtype.kind not in "iu":
        raise RequestError(f"input '{name}' must hold integer token ids, got {array.dtype}")
    low, high = int(array.min()), int(array.max())
    if low < 0 or high >= vocab:
        raise RequestError(f"input '{name}' holds token id {low if low < 0 else high}, outside 0..{vocab - 1}")


def check_rows(array: Any, name: str, batch: int) -> None:
    """An optional per-row input must have one row per request of the batch."""
    if array is not None and (array.ndim < 1 or array.shape[0] != batch):
        raise RequestError(f"input '{name}' has shape {list(array.shape)}, expected {batch} row(s)")


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def error_message(exc: BaseException, where: str) -> tuple[str, bool]:
    """(what the client is told, whether it is the client's fault) for a failure in model `where`."""
    if isinstance(exc, GenerationError):  # RequestError included
        return one_line(exc.message or type(exc).__name__), True
    return f"internal error in {where} ({type(exc).__name__}); the server log has the details", False


def triton_error(pb_utils: Any, exc: BaseException, where: str) -> Any:
    """The `pb_utils.TritonError` for `exc` (INVALID_ARG for a bad request, else INTERNAL after logging
    the traceback with `pb_utils.Logger`). `pb_utils` is passed in so that this module stays importable
    without Triton."""
    message, client = error_message(exc, where)
    if not client:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        pb_utils.Logger.log_error(f"trtspec {where}: {trace}")
    code = pb_utils.TritonError.INVALID_ARG if client else pb_utils.TritonError.INTERNAL
    return pb_utils.TritonError(message, code=code)


def check_batch(array: Any, name: str) -> None:
    if array is not None and array.ndim >= 1 and array.shape[0] != 1:
        raise RequestError(f"send one prompt per request ('{name}' has batch size {array.shape[0]}); "
                           "concurrent requests are batched on the server")


def check_lengths(n_input: int, max_tokens: int | None, max_input_len: int, max_output_len: int) -> None:
    if n_input <= 0:
        raise RequestError("the prompt is empty")
    if n_input > max_input_len:
        raise RequestError(f"the prompt has {n_input} tokens, more than max_input_len={max_input_len}")
    if max_tokens is None:
        raise RequestError("max_tokens is required")
    if max_tokens <= 0:  # no value: over HTTP a JSON number past INT32 arrives wrapped (1e12 -> -727379968)
        raise RequestError(f"max_tokens must be > 0 and at most max_output_len={max_output_len} "
                           f"(an INT32 in 1..{max_output_len})")
    if max_tokens > max_output_len:
        raise RequestError(f"max_tokens={max_tokens} exceeds max_output_len={max_output_len}")


def check_parameters(parameters: str | dict | None, allowed: set[str]) -> None:
    """Reject request parameters this deployment does not know (e.g. a misspelt generate key)."""
    if not parameters:
        return
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters)
        except json.JSONDecodeError:
            return
    if not isinstance(parameters, dict):  # JSON that is not an object ("5", "[1]", "null"): no parameters
        return
    unknown = sorted(k for k in parameters if k not in allowed and not k.startswith("triton_"))
    if unknown:
        raise RequestError(f"unknown parameter{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                           f"known inputs: {', '.join(sorted(allowed))}")


class RecentSteps:
    """Acceptance rate and tokens per step over the engine's last `n` steps (the gauges), from the engine's
    per-step SpecDecodingStats; tokens per step as trtspec.runtime.stats defines it (per request-step)."""

    def __init__(self, n: int = 256):
        self._steps: deque[tuple[int, int, int, int]] = deque(maxlen=n)
        self._lock = threading.Lock()

    def add(self, step: SpecDecodingStats) -> tuple[float, float]:
        with self._lock:
            self._steps.append((step.num_emitted_tokens, step.num_draft_tokens, step.num_accepted_tokens,
                                step.batch_size))
            tokens, drafted, accepted, steps = (sum(column) for column in zip(*self._steps))
            return acceptance_rate(accepted, drafted), tokens_per_step(tokens, steps)


# --------------------------------------------------------------------------------------------
# Lifecycle: die with the server, drain when the server asks (see trtspec/serve/drain.py)
# --------------------------------------------------------------------------------------------

CONTROL_DIR_ENV = "TRTSPEC_CONTROL_DIR"     # set by trtspec's TritonServer: where drain requests appear
DRAIN_FILE = "drain.json"                    # {"deadline": <time.monotonic()>, "refuse_new": bool}
SHM_DIR = "/dev/shm"


def _stub_shm_region() -> str | None:
    """This stub's shared-memory region name (its argv[2]: `stub <model.py> <region> ...`), if it is a file
    in /dev/shm."""
    try:
        args = Path("/proc/self/cmdline").read_bytes().split(b"\0")
        name = args[2].decode() if len(args) > 2 and args[0].endswith(b"triton_python_backend_stub") else ""
    except (OSError, UnicodeDecodeError):
        return None
    return name if name and "/" not in name and os.path.isfile(os.path.join(SHM_DIR, name)) else None


def _orphaned() -> None:
    """The server died without stopping this stub (kill -9, crash): leave at once. The stub's own health
    check asks `kill(parent, 0)`, which keeps succeeding while the dead server is an unreaped zombie, and
    its exit path can block in futex waits on the dead server's locks; os._exit skips all of that. The
    region the dead server made for this stub is removed too (nobody else will)."""
    region = _stub_shm_region()
    if region:
        try:
            os.unlink(os.path.join(SHM_DIR, region))
        except OSError:
            pass
    os._exit(1)


def marker(kind: str) -> Path | None:
    """`<control dir>/<kind>-<pid>` (instance, drained), or None outside a trtspec-started server."""
    control = os.environ.get(CONTROL_DIR_ENV)
    return Path(control) / f"{kind}-{os.getpid()}" if control else None


def read_drain_request(control_dir: str | Path) -> dict[str, Any] | None:
    try:
        data = json.loads((Path(control_dir) / DRAIN_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("deadline"), (int, float)) else None


def watch_server(on_drain=None, interval: float = 0.2) -> threading.Thread:
    """Start the lifecycle thread of one Python-backend model instance (call it from `initialize`).

    - When the parent process changes (the server is gone: Linux re-parents orphans at once, even while the
      dead server is still an unreaped zombie), the stub exits (`_orphaned`). PR_SET_PDEATHSIG is not used:
      it fires when the *thread* of the server that forked the stub exits, which happens in a live server.
    - With `on_drain(deadline, refuse_new, on_idle)` (the generation model): this instance announces itself
      as `<control>/instance-<pid>`; when `<control>/drain.json` appears it calls `on_drain` on a thread of
      its own, whose `on_idle()` (at the latest when it returns) writes `<control>/drained-<pid>`: what the
      stopping server waits for.
    """
    parent = os.getppid()
    announce = marker("instance") if on_drain is not None else None
    if announce is not None:
        try:
            announce.parent.mkdir(parents=True, exist_ok=True)
            announce.write_text("", encoding="utf-8")
        except OSError:
            announce = None

    def drained() -> None:
        done = marker("drained")
        if done is not None:
            try:
                done.write_text("", encoding="utf-8")
            except OSError:
                pass

    def drain(request: dict[str, Any]) -> None:
        try:
            on_drain(float(request["deadline"]), bool(request.get("refuse_new", True)), drained)
        finally:
            drained()

    def run() -> None:
        import time

        draining = False
        while True:
            if os.getppid() != parent:
                _orphaned()
            if announce is not None and not draining:
                request = read_drain_request(announce.parent)
                if request is not None:
                    draining = True
                    threading.Thread(target=drain, args=(request,), name="trtspec-drain", daemon=True).start()
            time.sleep(interval)

    thread = threading.Thread(target=run, name="trtspec-watchdog", daemon=True)
    thread.start()
    return thread


def forget_instance() -> None:
    """Remove this instance's markers (from `finalize`: an unloaded instance is not waited for)."""
    for kind in ("instance", "drained"):
        path = marker(kind)
        if path is not None:
            try:
                path.unlink()
            except OSError:
                pass
