"""One request from admission to its result: validation where it enters (`validate`), its own random stream,
its K (fixed, or adaptive and capped by the load), the stop conditions, its text (detok.TextStream), its stats
(stats.RequestStats) and the StepEvents it sends."""

from __future__ import annotations

import dataclasses
import itertools
import numbers
import operator
import os
import time
import uuid
from collections.abc import Callable, Sequence

import torch

from trtspec.errors import GenerationError
from trtspec.runtime.adaptive import AdaptiveConfig, AdaptiveK, Price, SharedAcceptance
from trtspec.runtime.detok import TextStream
from trtspec.runtime.sampling import SamplingParams
from trtspec.runtime.stats import RequestStats

# request limits: stop strings are searched in the text at every token (and held back while streaming);
# a temperature below MIN_TEMPERATURE (other than 0) overflows logits / T in float32 into NaN probabilities
MAX_STOP_STRINGS, MAX_STOP_CHARS, MIN_TEMPERATURE = 16, 256, 1e-5


@dataclasses.dataclass
class StepEvent:
    """What one step did for one request. `text` is the newly decoded text (held back while a character is
    incomplete or while its end could still grow into a stop string; the stop string is trimmed). The last
    event has finished=True and a finish_reason:
    "length" | "eos" | "stop" | "cancelled" | "shutdown" (cut by drain()) | "error" (then `error` says why)."""

    request_id: str
    tokens: list[int]
    text: str = ""
    drafted: int = 0
    accepted: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class GenerationResult:
    """One finished request; the counters are its stats.RequestStats (steps: verify steps after the prefill;
    tokens_per_step as stats.tokens_per_step defines it; a tree counts all its nodes as drafted);
    draft/verify seconds: the time of the steps it took part in."""

    request_id: str
    prompt_tokens: int
    tokens: list[int]
    text: str
    finish_reason: str
    steps: int
    drafted: int
    accepted: int
    acceptance_rate: float
    tokens_per_step: float
    seconds: float
    draft_seconds: float
    verify_seconds: float
    ttft_seconds: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def validate(prompt: list[int], p: SamplingParams, *, vocab: int, max_input_len: int, max_output_len: int,
             k_max: int, tokenizer) -> None:
    """Every sampling setting where a request enters (generate, generate_batch, stream, submit alike): one
    GenerationError naming the setting, with a hint."""
    if not isinstance(p, SamplingParams):
        raise GenerationError(f"sampling params must be a SamplingParams, not {type(p).__name__}")
    if not prompt:
        raise GenerationError("empty prompt", hint="send at least one token")
    if len(prompt) > max_input_len:
        raise GenerationError(f"prompt has {len(prompt)} tokens, more than limits.max_input_len = "
                              f"{max_input_len}", hint="shorten the prompt or raise limits.max_input_len")
    if not all(0 <= t < vocab for t in prompt):
        raise GenerationError(f"prompt token ids must be in [0, {vocab})", hint="the model's vocab_size is the bound")
    if not _is_int(p.max_new_tokens) or not 0 < p.max_new_tokens <= max_output_len:
        raise GenerationError(f"max_new_tokens = {p.max_new_tokens!r} must be an integer in "
                              f"1..{max_output_len} (limits.max_output_len)",
                              hint="ask for fewer tokens or raise the limit")
    # NaN compares false with everything: every check is written so that NaN fails it
    t = p.temperature
    if not (_is_real(t) and (t == 0 or MIN_TEMPERATURE <= t < float("inf"))):
        raise GenerationError(f"bad sampling setting: temperature = {t!r}",
                              hint=f"0 (greedy) or a finite number >= {MIN_TEMPERATURE:g}")
    if not (_is_int(p.top_k) and p.top_k >= 0):
        raise GenerationError(f"bad sampling setting: top_k = {p.top_k!r}", hint="an integer >= 0 (0: off)")
    if not (_is_real(p.top_p) and 0 < p.top_p <= 1):
        raise GenerationError(f"bad sampling setting: top_p = {p.top_p!r}", hint="a number in (0, 1] (1: off)")
    if p.seed is not None and not (_is_int(p.seed) and 0 <= p.seed < 2**64):
        raise GenerationError(f"bad sampling setting: seed = {p.seed!r}",
                              hint="an integer in [0, 2^64), or none for a random one")
    k = p.num_draft_tokens
    if k is not None and not (_is_int(k) and 0 <= k <= k_max):
        raise GenerationError(f"num_draft_tokens = {k!r} must be in 0..{k_max}",
                              hint="the spec's speculative.num_draft_tokens is the maximum")
    if p.end_id is not None and not (_is_int(p.end_id) and -1 <= p.end_id < vocab):
        raise GenerationError(f"end_id = {p.end_id!r} must be -1 (none) or a token id in [0, {vocab})",
                              hint="leave it unset for the model's EOS")
    if not isinstance(p.stop, (tuple, list)) or not all(isinstance(s, str) and s for s in p.stop):
        raise GenerationError("stop must be a sequence of non-empty strings", hint='e.g. stop=("\\n\\n",)')
    if len(p.stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in p.stop):
        raise GenerationError(f"stop: {len(p.stop)} strings of up to {max(map(len, p.stop))} characters",
                              hint=f"at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} "
                                   "characters each")
    if p.stop and tokenizer is None:
        raise GenerationError("stop strings need a tokenizer")


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def token_ids(prompt) -> list[int]:
    """Token ids as ints (Python, numpy or 0-d integer tensors); anything else is a GenerationError."""
    try:
        return [operator.index(t) for t in prompt]
    except TypeError:
        raise GenerationError("a prompt must be text or a sequence of integer token ids",
                              hint=f"got {type(prompt).__name__}") from None


class Request:
    """One request from admission to its result."""

    _ids = itertools.count()

    def __init__(self, prompt: list[int], params: SamplingParams, on_event: Callable[[StepEvent], None],
                 eos: frozenset[int], k_max: int, adaptive: AdaptiveConfig, options: Sequence[tuple[int, int]],
                 price: Price, tokenizer=None, shared: SharedAcceptance | None = None):
        self.id = f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        self.prompt, self.params, self.on_event, self.eos = prompt, params, on_event, eos
        self.seq: list[int] = list(prompt)
        self.gen: torch.Generator | None = None
        if not params.greedy:
            self.gen = torch.Generator()
            self.gen.manual_seed(params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little"))
        fixed = params.num_draft_tokens
        self.fixed_k = None if fixed is None else min(fixed, k_max)
        self.use_adaptive = fixed is None and adaptive.enabled
        self.load_capped = fixed is None and (params.greedy or params.seed is None)  # see load_cap
        # adaptive K priced at the step's batch (the engine may cap it with the batch's other requests), and by its
        # drafter's acceptance shared among such requests (`shared`) until it has its own
        self.follows_batch = self.use_adaptive and self.load_capped
        self.adaptive = AdaptiveK(options, adaptive if fixed is None else AdaptiveConfig(enabled=False), price,
                                  shared if self.follows_batch else None)
        self.text = None if tokenizer is None else TextStream(tokenizer, params.stop)
        self.stats = RequestStats()
        self.t_submit = time.perf_counter()
        self.t_first = self.t_done = None
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.result: GenerationResult | None = None
        self.last_k = 0
        self.drafter = 0  # its drafter in a routed engine (runtime/router.py), chosen once, kept for its life

    @property
    def generated(self) -> list[int]:
        return self.seq[len(self.prompt):]

    def uniforms(self, n: int) -> list[float]:
        """n draws from this request's own generator (its output does not depend on its batch)."""
        return torch.rand(n, generator=self.gen).tolist()

    @property
    def room(self) -> int:
        """Draft tokens that can still be kept: a step emits its accepted drafts plus one token."""
        return self.params.max_new_tokens - (len(self.seq) - len(self.prompt)) - 1

    def choose_k(self, cap: int, k_is_depth: bool = True, batch: int = 1) -> int:
        """This step's K: fixed, or adaptive, priced at the step's `batch` and capped by the load (`cap`),
        unless the request is seeded and sampled, whose output must not depend on the batch (priced at batch
        1, never capped); never past what the request can still keep."""
        if self.fixed_k is not None:
            k = self.fixed_k
        elif self.use_adaptive:
            k = self.adaptive.next_k(batch if self.load_capped else 1)
        else:
            k = self.adaptive.k_max
        if self.load_capped:
            k = min(k, cap)
        if self.room <= 0:
            k = 0
        elif k_is_depth:
            k = min(k, self.room)
        self.last_k = max(0, k)
        return self.last_k

    def learn(self, accepted: int, depth: int, nodes: int | None = None) -> None:
        """The step's acceptance and the draft's nodes, for adaptive K."""
        if self.use_adaptive and self.last_k:
            self.adaptive.update(self.last_k, accepted, depth, nodes)

    def extend(self, new: list[int]) -> list[int]:
        """Append new tokens through the stop conditions (EOS, max_new_tokens, stop strings: at the token that
        completes one); the ones kept. Sets finish_reason when one ended the request."""
        out, reason, stops = [], None, bool(self.params.stop)
        for t in new:
            self.seq.append(t)
            out.append(t)
            if t in self.eos:
                reason = "eos"
            elif len(self.seq) - len(self.prompt) >= self.params.max_new_tokens:
                reason = "length"
            if stops and self.text.push([t]):
                reason = "stop"
            if reason:
                break
        if self.text is not None and not stops:
            self.text.push(out)
        self.finish_reason = reason
        return out

    def send(self, tokens: list[int], drafted: int = 0, accepted: int = 0, draft_s: float = 0.0,
             verify_s: float = 0.0) -> bool:
        """Send the event of the tokens `extend` kept; True if the request ended."""
        final = self.finish_reason is not None
        ev = StepEvent(self.id, tokens, "" if self.text is None else self.text.delta(final), drafted, accepted,
                       draft_s, verify_s, finished=final, finish_reason=self.finish_reason)
        self.stats.observe(ev)
        if final:
            self._result()
        self._send(ev)
        return final

    def finish(self, reason: str) -> None:
        """End without new tokens (cancelled, shutdown, error)."""
        self.finish_reason = reason
        self._result()
        self._send(StepEvent(self.id, [], "", finished=True, finish_reason=reason,
                             error=None if self.error is None else f"{type(self.error).__name__}: {self.error}"))

    def _result(self) -> None:
        self.t_done = time.perf_counter()
        s = self.stats
        text = self.text.text if self.text is not None and self.finish_reason not in ("cancelled", "error") else ""
        self.result = GenerationResult(
            request_id=self.id, prompt_tokens=len(self.prompt), tokens=list(self.generated), text=text,
            finish_reason=self.finish_reason or "error", steps=s.steps, drafted=s.drafted, accepted=s.accepted,
            acceptance_rate=s.acceptance_rate, tokens_per_step=s.tokens_per_step,
            seconds=self.t_done - self.t_submit, draft_seconds=s.draft_seconds, verify_seconds=s.verify_seconds,
            ttft_seconds=(self.t_first or self.t_done) - self.t_submit)

    def _send(self, ev: StepEvent) -> None:
        try:
            self.on_event(ev)
        except Exception:  # a failing consumer cancels its own request, not the engine
            self.cancelled = True
