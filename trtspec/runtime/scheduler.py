"""The scheduler half of SpecEngine (vLLM v1 splits a scheduler from the model runner): which requests run.

Requests are validated where they enter (`validate`), then wait in a FIFO. Each tick ends cancelled requests,
admits waiting ones into free rows (the runner prefills their prompts together in one pass) and then runs one
decode step for every active request. A finished request's row is refilled by the next one; active rows stay
dense (the last row moves into the hole, `retire`), so a step runs on a plain slice of the caches. All model
state is touched by one tick at a time (a lock); `submit` starts one background thread running ticks, the
synchronous APIs drive ticks themselves when it does not run. A failing tick fails the requests in flight
and leaves the engine usable for the next ones.

Per request (`Request`): its own random stream, its K (fixed, or adaptive and capped by the load), the stop
conditions, its text (detok.TextStream) and its stats (stats.RequestStats); it sends its StepEvents.
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
import operator
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from trtspec.errors import GenerationError
from trtspec.runtime.detok import TextStream
from trtspec.runtime.sampling import SamplingParams
from trtspec.runtime.stats import RequestStats

# request limits: stop strings are searched in the text at every token (and held back while streaming);
# a temperature below MIN_TEMPERATURE (other than 0) overflows logits / T in float32 into NaN probabilities
MAX_STOP_STRINGS, MAX_STOP_CHARS, MIN_TEMPERATURE = 16, 256, 1e-5
DRAFT_COST = 0.15  # c: one draft token's cost in target decode steps (draft pass + verify growth; CPU-typical)


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


# ------------------------------------------------------------------------------------------- adaptive K

@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    enabled: bool = True
    min_draft_tokens: int = 1
    history: int = 8
    fallback_acceptance: float = 0.2


def expected_tokens(alpha: float, depth: int) -> float:
    """E[tokens/step] = (1 - α^(K+1)) / (1 - α) for K = depth i.i.d. drafts (reference/speculative-decoding.md)."""
    return depth + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (depth + 1)) / (1.0 - alpha)


def best_option(alpha: float, options: Sequence[tuple[int, int]], cost: float, overhead: float = 0.0,
                width: float = 1.0) -> int:
    """The draft budget maximising the ideal speedup E[τ](α, depth) / (1 + (overhead + width·budget)·c) (ties:
    the smaller). `overhead`: draft-token equivalents a drafting step costs whatever its budget (lookahead's
    window), `width`: verified tokens per unit of budget (lookahead's G candidates per depth)."""
    return _best(alpha, options, cost, overhead, width)[0]


def _best(alpha: float, options: Sequence[tuple[int, int]], cost: float, overhead: float,
          width: float) -> tuple[int, float]:
    best, best_gain = options[0][0], -1.0
    for budget, depth in options:
        gain = expected_tokens(alpha, depth) / (1.0 + (overhead + width * budget) * cost)
        if gain > best_gain + 1e-9:
            best, best_gain = budget, gain
    return best, best_gain


class AdaptiveK:
    """Draft length of one request from its recent acceptance, by the speedup formula.

    α̂: per-token acceptance over the last ~`history` steps (EMA span): EMA(accepted) / EMA(drafts tested),
    where a step tests its accepted drafts plus the one rejected, if any. Each step drafts the option (budget,
    depth) that maximises the ideal speedup E[τ](α̂, depth) / (1 + budget·c): options are (k, k) for
    k_min..k_max for chains and (first n nodes, their depth) for a tree; c is the cost of one draft token in
    target steps. So K grows while drafts are accepted and shrinks as α̂ falls. When α̂ stays below `fallback`
    (after `history` steps), or a drafter with a fixed per-step cost (`overhead`) no longer pays for it
    (`pays`), the request decodes plainly (K = 0) for `history` steps (such a drafter: twice as long after
    each failed probe, up to 16x), then probes once with the smallest option; the probe's acceptance restarts
    α̂. Deterministic given the acceptance history (seeded
    sampling stays reproducible).
    """

    def __init__(self, options: Sequence[tuple[int, int]], cfg: AdaptiveConfig, cost: float = DRAFT_COST,
                 overhead: float = 0.0, width: float = 1.0):
        k_max = max((b for b, _ in options), default=0)
        self.overhead, self.width = overhead, width
        self.k_max = k_max
        self.options = sorted(o for o in options if o[0] >= min(cfg.min_draft_tokens, k_max)) or [(0, 0)]
        self.k_min = self.options[0][0]
        self.cost, self.history, self.fallback = cost, cfg.history, cfg.fallback_acceptance
        self.weight = 2.0 / (cfg.history + 1)
        self.alpha: float | None = None
        self.acc = self.trials = 0.0
        self.steps, self.off, self.probing = 0, 0, False
        self.failed_probes = 0  # in a row (backoff of drafters with an overhead)

    @property
    def k(self) -> int:
        return self.k_max if self.alpha is None else best_option(self.alpha, self.options, self.cost,
                                                                 self.overhead, self.width)

    def pays(self) -> bool:
        """A drafter with a fixed per-step cost (overhead > 0: a lookahead branch) pays only while its best
        option's ideal speedup exceeds 1; below, it falls back like a low acceptance does."""
        return self.overhead <= 0 or _best(self.alpha, self.options, self.cost, self.overhead, self.width)[1] > 1.0

    def next_k(self) -> int:
        if self.off > 0:
            self.off -= 1
            self.probing = self.off == 0
            return 0
        return self.k_min if self.probing else self.k

    def update(self, k: int, accepted: int, depth: int) -> None:
        if k == 0 or depth == 0:
            return
        trials = accepted + (1 if accepted < depth else 0)  # drafts tested: the accepted ones and the rejected one
        probe = self.probing
        if self.probing or self.alpha is None:
            self.steps = self.history if self.probing else self.steps + 1  # a probe decides at once
            self.probing, self.acc, self.trials = False, float(accepted), float(trials)
        else:  # pooled over recent steps (an average of per-step ratios would be biased low)
            self.acc += self.weight * (accepted - self.acc)
            self.trials += self.weight * (trials - self.trials)
            self.steps += 1
        self.alpha = self.acc / self.trials
        if self.steps >= self.history and (self.alpha < self.fallback or not self.pays()):
            # a drafter whose every step costs (overhead > 0) backs off while its probes keep failing: each
            # failed probe doubles the plain stretch (at most 16x), so a probe costs a few % at most
            self.failed_probes = self.failed_probes + 1 if probe and self.overhead > 0 else 0
            self.off = self.history << min(self.failed_probes, 4)
        elif probe:
            self.failed_probes = 0


def load_cap(k_max: int, active: int) -> int:
    """Global cap on K by load (a draft_len_schedule): K at 1-2 requests, then shrinking as ~2K/(n+1). Not for
    seeded sampled requests: their K decides how many of their own random numbers a step draws, so a K that
    followed the load would make their output depend on what else runs (see Request.choose_k)."""
    return k_max if active <= 2 else max(1, -(-2 * k_max // (active + 1)))


# --------------------------------------------------------------------------------------------- requests

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
                 cost: float, tokenizer=None, plan_cost: tuple[float, float] = (0.0, 1.0)):
        self.id = f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        self.prompt, self.params, self.on_event, self.eos = prompt, params, on_event, eos
        self.seq: list[int] = list(prompt)
        self.gen: torch.Generator | None = None
        if not params.greedy:
            self.gen = torch.Generator()
            self.gen.manual_seed(params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little"))
        fixed = params.num_draft_tokens
        self.fixed_k = None if fixed is None else min(fixed, k_max)
        self.adaptive = AdaptiveK(options, adaptive if fixed is None else AdaptiveConfig(enabled=False), cost,
                                  *plan_cost)  # (overhead, width) of the proposer's DraftPlan
        self.use_adaptive = fixed is None and adaptive.enabled
        self.load_capped = fixed is None and (params.greedy or params.seed is None)  # see load_cap
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

    def choose_k(self, cap: int, k_is_depth: bool = True) -> int:
        """This step's K: fixed, or adaptive and capped by the load (`cap`) unless the request is seeded and
        sampled, whose output must not depend on the batch; never past what the request can still keep."""
        k = self.fixed_k if self.fixed_k is not None else (
            self.adaptive.next_k() if self.use_adaptive else self.adaptive.k_max)
        if self.load_capped:
            k = min(k, cap)
        if self.room <= 0:
            k = 0
        elif k_is_depth:
            k = min(k, self.room)
        self.last_k = max(0, k)
        return self.last_k

    def learn(self, accepted: int, depth: int) -> None:
        """The step's acceptance, for adaptive K."""
        if self.use_adaptive and self.last_k:
            self.adaptive.update(self.last_k, accepted, depth)

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


# -------------------------------------------------------------------------------------------- scheduling

class Runner(Protocol):
    """The model side (SpecEngine): runs what the scheduler decides, returns the requests that ended."""

    def prefill(self, reqs: list[Request], row0: int) -> list[Request]: ...

    def step(self, reqs: list[Request]) -> list[Request]: ...

    def move_row(self, src: int, dst: int) -> None: ...

    def free_row(self, row: int) -> None: ...

    def reset(self) -> None: ...


class Scheduler:
    """FIFO admission into `max_batch` dense rows, the background thread, cancellation and drain."""

    def __init__(self, max_batch: int, runner: Runner):
        self.max_batch, self.runner = max_batch, runner
        self.active: list[Request] = []    # request b runs in row b
        self.waiting: list[Request] = []
        self._cv = threading.Condition()
        self._lock = threading.RLock()     # one tick at a time
        self._thread: threading.Thread | None = None
        self._closing = False
        self._draining = False             # drain(): no new requests

    @property
    def running(self) -> bool:
        """The background thread drives the ticks."""
        return self._thread is not None and self._thread.is_alive()

    def enqueue(self, reqs: list[Request]) -> None:
        with self._cv:
            if self._closing:
                raise GenerationError("the engine is closed")
            if self._draining:
                raise GenerationError("the server is shutting down: not accepting new requests",
                                      hint="retry against another replica or after the restart")
            self.waiting.extend(reqs)
            self._cv.notify_all()

    def start(self) -> None:
        """Start the background thread, unless it runs."""
        with self._cv:
            if not self.running:
                if self._closing:
                    raise GenerationError("the engine is closed")
                self._thread = threading.Thread(target=self._loop, name="trtspec-scheduler", daemon=True)
                self._thread.start()

    def cancel(self, request_id: str) -> None:
        with self._cv:
            for r in self.waiting + self.active:
                if r.id == request_id:
                    r.cancelled = True
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closing = True
            for r in self.waiting + self.active:
                r.cancelled = True
            self._cv.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=60)
        self.tick()  # deliver the cancellations

    def drain(self, deadline: float, refuse_new: bool = True, on_idle: Callable[[], None] | None = None,
              poll: float = 0.05) -> bool:
        """See SpecEngine.drain."""
        with self._cv:
            self._draining = self._draining or refuse_new
        idle_seen = False
        while time.monotonic() < deadline:
            with self._cv:
                idle = not self.waiting and not self.active
            if idle and not idle_seen:
                idle_seen = True
                if on_idle is not None:
                    on_idle()
                if refuse_new:
                    return True
            time.sleep(poll)
        with self._lock:  # between two ticks
            with self._cv:
                self._draining = True
                waiting, self.waiting = self.waiting, []
            active = list(self.active)
            for r in active:
                self.finish(r, "shutdown")
            for r in waiting:
                self.finish(r, "shutdown", active=False)
        if on_idle is not None and not idle_seen:
            on_idle()
        return not (active or waiting)

    def drive(self, done: Callable[[], bool]) -> None:
        """Run ticks on this thread until `done()`."""
        while not done():
            self.tick()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closing and not self.waiting and not self.active:
                    self._cv.wait()
                if self._closing:
                    return
            self.tick()

    def tick(self) -> None:
        """Cancellations, admissions (prefill), then one decode step for every active request."""
        with self._lock:
            new: list[Request] = []
            try:
                for r in [r for r in self.active if r.cancelled]:
                    self.finish(r, "cancelled")
                with self._cv:
                    gone = [r for r in self.waiting if r.cancelled]
                    self.waiting = [r for r in self.waiting if not r.cancelled]
                    free = self.max_batch - len(self.active)
                    new, self.waiting = self.waiting[:free], self.waiting[free:]
                for r in gone:
                    self.finish(r, "cancelled", active=False)
                if new:
                    row0 = len(self.active)
                    self.active.extend(new)
                    # tokens go out after admission: a request that ends at once frees its row the usual way
                    self.retire(self.runner.prefill(new, row0))
                if self.active:
                    self.retire(self.runner.step(self.active))
            except Exception as exc:  # fail the requests in flight, keep the engine usable for the next ones
                failed = list(self.active) + [r for r in new if r.result is None and r not in self.active]
                self.active = []
                self.runner.reset()
                for r in failed:
                    r.error = exc
                    self.finish(r, "error", active=False)

    def retire(self, ended: list[Request]) -> None:
        """Free the rows of finished requests, keeping active rows dense (the last row moves into the hole)."""
        for i in sorted((self.active.index(r) for r in ended if r in self.active), reverse=True):
            last = len(self.active) - 1
            if i != last:
                self.runner.move_row(last, i)
                self.active[i] = self.active[last]
            else:
                self.runner.free_row(i)
            self.active.pop()

    def finish(self, r: Request, reason: str, active: bool = True) -> None:
        r.finish(reason)
        if active and r in self.active:
            self.retire([r])
