"""SpecEngine: the reference speculative-decoding runtime (torch), with continuous batching.

One step for every active request at once:
  1. choose K per request (adaptive: recent acceptance, a cap by load, fallback to plain decoding);
  2. the drafter proposes a chain or tree per request;
  3. the target verifies all of them in ONE forward pass: per row [pending token, draft nodes...], padded,
     each row at its own cache length, with a causal or tree mask;
  4. acceptance per row (sampling.py), then the row's cache length moves past the kept entries only;
  5. the drafter commits; the new tokens go through the stop conditions and out as StepEvents.
Requests wait in a FIFO; a finished request's row is refilled by the next one (its prompt is prefilled in a
separate pass before it joins the step). All model state is touched by one tick at a time (`_run_lock`);
`submit` starts one background scheduler thread, the synchronous APIs drive ticks themselves when it is not
running.
"""

from __future__ import annotations

import dataclasses
import itertools
import numbers
import operator
import os
import queue
import threading
import time
import uuid
from typing import Callable, Iterator, Sequence

import torch

from trtspec.errors import GenerationError
from trtspec.runtime.cache import chain_inputs, tree_inputs
from trtspec.runtime.drafters import Drafter, make_drafter
from trtspec.runtime.llama import Llama
from trtspec.runtime.sampling import SamplingParams, children_of, processed_probs, sample, verify_greedy, verify_sampled


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
    """One finished request. steps: target verify passes after the prefill; tokens_per_step: tokens those
    steps emitted per step (the prefill's first token excluded); acceptance_rate: accepted / drafted draft
    tokens (a tree counts all its nodes as drafted); draft/verify seconds: the time of the steps it took part in."""

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


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    enabled: bool = True
    min_draft_tokens: int = 1
    history: int = 8
    fallback_acceptance: float = 0.2


# request limits: stop strings are searched in the whole text at every token (and held back while streaming);
# a temperature below MIN_TEMPERATURE (other than 0) overflows logits / T in float32 into NaN probabilities
MAX_STOP_STRINGS, MAX_STOP_CHARS, MIN_TEMPERATURE = 16, 256, 1e-5
DRAFT_COST = 0.15  # c: one draft token's cost in target decode steps (draft pass + verify growth; CPU-typical)


def expected_tokens(alpha: float, depth: int) -> float:
    """E[tokens/step] = (1 - α^(K+1)) / (1 - α) for K = depth i.i.d. drafts (reference/speculative-decoding.md)."""
    return depth + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (depth + 1)) / (1.0 - alpha)


def best_option(alpha: float, options: list[tuple[int, int]], cost: float) -> int:
    """The draft budget maximising the ideal speedup E[τ](α, depth) / (1 + budget·c) (ties: the smaller)."""
    best, best_gain = options[0][0], -1.0
    for budget, depth in options:
        gain = expected_tokens(alpha, depth) / (1.0 + budget * cost)
        if gain > best_gain + 1e-9:
            best, best_gain = budget, gain
    return best


class AdaptiveK:
    """Draft length of one request from its recent acceptance, by the speedup formula.

    α̂: per-token acceptance over the last ~`history` steps (EMA span): EMA(accepted) / EMA(drafts tested),
    where a step tests its accepted drafts plus the one rejected, if any. Each step drafts the option (budget, depth) that maximises the ideal speedup
    E[τ](α̂, depth) / (1 + budget·c): options are (k, k) for k_min..k_max for chains and (first n nodes, their
    depth) for a tree; c is the cost of one draft token in target steps. So K grows while drafts are accepted
    and shrinks as α̂ falls. When α̂ stays below `fallback` (after `history` steps) the request decodes plainly
    (K = 0) for `history` steps, then probes once with the smallest option; the probe's acceptance restarts α̂.
    Deterministic given the acceptance history (seeded sampling stays reproducible).
    """

    def __init__(self, options: list[tuple[int, int]], cfg: AdaptiveConfig, cost: float = DRAFT_COST):
        k_max = max((b for b, _ in options), default=0)
        self.k_max = k_max
        self.options = sorted(o for o in options if o[0] >= min(cfg.min_draft_tokens, k_max)) or [(0, 0)]
        self.k_min = self.options[0][0]
        self.cost, self.history, self.fallback = cost, cfg.history, cfg.fallback_acceptance
        self.weight = 2.0 / (cfg.history + 1)
        self.alpha: float | None = None
        self.acc = self.trials = 0.0
        self.steps, self.off, self.probing = 0, 0, False

    @property
    def k(self) -> int:
        return self.k_max if self.alpha is None else best_option(self.alpha, self.options, self.cost)

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
        if self.probing or self.alpha is None:
            self.steps = self.history if self.probing else self.steps + 1  # a probe decides at once
            self.probing, self.acc, self.trials = False, float(accepted), float(trials)
        else:  # pooled over recent steps (an average of per-step ratios would be biased low)
            self.acc += self.weight * (accepted - self.acc)
            self.trials += self.weight * (trials - self.trials)
            self.steps += 1
        self.alpha = self.acc / self.trials
        if self.steps >= self.history and self.alpha < self.fallback:
            self.off = self.history


def load_cap(k_max: int, active: int) -> int:
    """Global cap on K by load (a draft_len_schedule): K at 1-2 requests, then shrinking as ~2K/(n+1). Not for
    seeded sampled requests: their K decides how many of their own random numbers a step draws, so a K that
    followed the load would make their output depend on what else runs (see _Request.choose_k)."""
    return k_max if active <= 2 else max(1, -(-2 * k_max // (active + 1)))


class _Request:
    _ids = itertools.count()

    def __init__(self, prompt: list[int], params: SamplingParams, on_event: Callable[[StepEvent], None],
                 eos: frozenset[int], k_max: int, adaptive: AdaptiveConfig, options: list[tuple[int, int]],
                 cost: float):
        self.id = f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        self.prompt, self.params, self.on_event, self.eos = prompt, params, on_event, eos
        self.seq: list[int] = list(prompt)
        self.gen: torch.Generator | None = None
        if not params.greedy:
            self.gen = torch.Generator()
            self.gen.manual_seed(params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little"))
        fixed = params.num_draft_tokens
        self.fixed_k = None if fixed is None else min(fixed, k_max)
        self.adaptive = AdaptiveK(options, adaptive if fixed is None else AdaptiveConfig(enabled=False), cost)
        self.use_adaptive = fixed is None and adaptive.enabled
        self.load_capped = fixed is None and (params.greedy or params.seed is None)  # see load_cap
        self.t_submit = time.perf_counter()
        self.t_first = self.t_done = None
        self.steps = self.drafted = self.accepted = self.step_tokens = 0
        self.draft_s = self.verify_s = 0.0
        self.finish_reason: str | None = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.text_sent = 0
        self.stop_at: int | None = None  # char index where a stop string starts
        self.result: GenerationResult | None = None
        self.last_k = 0

    @property
    def generated(self) -> list[int]:
        return self.seq[len(self.prompt):]

    def uniforms(self, n: int) -> list[float]:
        return torch.rand(n, generator=self.gen).tolist()

    @property
    def room(self) -> int:
        """Draft tokens that can still be kept: a step emits its accepted drafts plus one token."""
        return self.params.max_new_tokens - len(self.generated) - 1

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


class SpecEngine:
    """Speculative decoding with a target Llama and a drafter; see the module docstring."""

    def __init__(self, target: Llama, drafter: Drafter | None = None, tokenizer=None, *, max_batch_size: int = 4,
                 max_input_len: int = 512, max_output_len: int = 256, num_draft_tokens: int = 4,
                 adaptive: AdaptiveConfig = AdaptiveConfig(), name: str = "model", draft_cost: float = DRAFT_COST):
        self.target, self.drafter, self.tokenizer, self.name = target, drafter or Drafter(), tokenizer, name
        self.max_batch_size, self.max_input_len, self.max_output_len = max_batch_size, max_input_len, max_output_len
        self.adaptive = adaptive
        # slots: prompt + output + one step's draft nodes past the end (+ the pending token)
        self.max_seq = max_input_len + max_output_len + self.drafter.max_nodes(num_draft_tokens) + 2
        target.set_max_seq(self.max_seq)
        self.cache = target.new_cache(max_batch_size, self.max_seq)
        self.drafter.setup(target, max_batch_size, self.max_seq)
        self.k_max = self.drafter.max_draft_tokens(num_draft_tokens)
        self.method = self.drafter.name if self.k_max > 0 else "none"  # "draft-model", "medusa", ...
        self.k_options = self.drafter.k_options(self.k_max)  # (budget, depth) choices for adaptive K
        self.draft_cost = draft_cost
        self.device = target.device
        eos = set(target.cfg.eos_token_ids)
        if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos_ids = frozenset(eos)
        self._active: list[_Request] = []
        self._waiting: list[_Request] = []
        self._cv = threading.Condition()
        self._run_lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._draining = False  # drain(): no new requests

    @classmethod
    def from_spec(cls, spec, tokenizer=None) -> "SpecEngine":
        """Load target, drafter and tokenizer as `spec` (trtspec.spec.Spec) says."""
        if spec.runtime.torch.threads:
            torch.set_num_threads(spec.runtime.torch.threads)
        lim = spec.limits
        target = Llama.from_dir(spec.model.target, dtype=spec.model.dtype, device=spec.runtime.device,
                                max_seq=lim.max_seq_len, name="target")
        if tokenizer is None:
            os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(spec.tokenizer_dir))
        a = spec.speculative.adaptive
        k = 0 if spec.speculative.method == "none" else spec.speculative.num_draft_tokens
        return cls(target, make_drafter(spec), tokenizer, max_batch_size=lim.max_batch_size,
                   max_input_len=lim.max_input_len, max_output_len=lim.max_output_len, num_draft_tokens=k,
                   adaptive=AdaptiveConfig(a.enabled, a.min_draft_tokens, a.history, a.fallback_acceptance),
                   name=spec.model.name)

    # ------------------------------------------------------------------------------------------------ API

    def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> GenerationResult:
        return self.generate_batch([prompt], params)[0]

    def generate_batch(self, prompts: Sequence[str | Sequence[int]],
                       params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[GenerationResult]:
        """Decode several prompts together (up to max_batch_size at once, the rest as rows free up)."""
        plist = list(params) if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise GenerationError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        done = threading.Event()
        reqs: list[_Request] = []

        def on_event(ev: StepEvent) -> None:
            if ev.finished and all(r.result is not None for r in reqs):
                done.set()

        reqs.extend(self._make(self._encode(p), sp, on_event) for p, sp in zip(prompts, plist))
        self._enqueue(reqs)
        if self._thread_alive():  # the background thread drives; wait for our requests
            done.wait()
        else:
            self._drive(done.is_set)
        for r in reqs:
            if r.error is not None:
                raise r.error
        return [r.result for r in reqs]

    def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None) -> Iterator[StepEvent]:
        """Events of one request as its steps happen (the first carries the prefill's token)."""
        events: queue.SimpleQueue[StepEvent] = queue.SimpleQueue()
        req = self._make(self._encode(prompt), params or SamplingParams(), events.put)
        self._enqueue([req])
        finished = False
        try:
            while True:
                try:
                    ev = events.get_nowait()
                except queue.Empty:
                    if self._thread_alive():
                        ev = events.get()
                    else:
                        self._drive(lambda: not events.empty())
                        continue
                yield ev
                if ev.finished:
                    finished = True
                    if req.error is not None:
                        raise req.error
                    return
        finally:
            if not finished:
                self.cancel(req.id)
                if not self._thread_alive():
                    with self._run_lock:
                        self._tick()

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None, on_event: Callable[[StepEvent], None]
               ) -> str:
        """Queue a request for the background scheduler thread; events go to on_event (called on that thread).
        Invalid requests raise GenerationError here."""
        req = self._make(_token_ids(prompt_ids), params or SamplingParams(), on_event)
        self._enqueue([req])
        with self._cv:
            if not self._thread_alive():
                if self._closing:
                    raise GenerationError("the engine is closed")
                self._thread = threading.Thread(target=self._loop, name="trtspec-scheduler", daemon=True)
                self._thread.start()
        return req.id

    def cancel(self, request_id: str) -> None:
        with self._cv:
            for r in self._waiting + self._active:
                if r.id == request_id:
                    r.cancelled = True
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closing = True
            for r in self._waiting + self._active:
                r.cancelled = True
            self._cv.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=60)
        with self._run_lock:
            self._tick()  # deliver the cancellations

    def drain(self, deadline: float, refuse_new: bool = True, on_idle: Callable[[], None] | None = None,
              poll: float = 0.05) -> bool:
        """Graceful shutdown: let the requests in flight run until `deadline` (a time.monotonic() value), then
        end the ones still running with a final event whose finish_reason is "shutdown" (their clients get a
        clean end, not a hung stream). With `refuse_new` new requests are refused at once and it returns
        as soon as nothing runs; without, requests admitted upstream may still arrive, so it keeps to the
        deadline. `on_idle` is called the first time nothing runs. True if nothing had to be cut."""
        with self._cv:
            self._draining = self._draining or refuse_new
        idle_seen = False
        while time.monotonic() < deadline:
            with self._cv:
                idle = not self._waiting and not self._active
            if idle and not idle_seen:
                idle_seen = True
                if on_idle is not None:
                    on_idle()
                if refuse_new:
                    return True
            time.sleep(poll)
        with self._run_lock:  # between two ticks
            with self._cv:
                self._draining = True
                waiting, self._waiting = self._waiting, []
            active = list(self._active)
            for r in active:
                self._finish(r, "shutdown")
            for r in waiting:
                self._finish(r, "shutdown", active=False)
        if on_idle is not None and not idle_seen:
            on_idle()
        return not (active or waiting)

    @property
    def num_active(self) -> int:
        return len(self._active)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    # ------------------------------------------------------------------------------------------ requests

    def _encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise GenerationError("this engine has no tokenizer: pass token ids")
            return list(self.tokenizer(prompt)["input_ids"])
        return _token_ids(prompt)

    def _make(self, prompt: list[int], params: SamplingParams, on_event) -> _Request:
        if not isinstance(params, SamplingParams):
            raise GenerationError(f"sampling params must be a SamplingParams, not {type(params).__name__}")
        self._validate(prompt, params)
        if params.end_id is None:
            eos = self.eos_ids
        else:
            eos = frozenset() if params.end_id < 0 else frozenset([params.end_id])
        return _Request(prompt, params, on_event, eos, self.k_max, self.adaptive, self.k_options, self.draft_cost)

    def _validate(self, prompt: list[int], p: SamplingParams) -> None:
        V = self.target.cfg.vocab_size
        if not prompt:
            raise GenerationError("empty prompt", hint="send at least one token")
        if len(prompt) > self.max_input_len:
            raise GenerationError(f"prompt has {len(prompt)} tokens, more than limits.max_input_len = "
                                  f"{self.max_input_len}", hint="shorten the prompt or raise limits.max_input_len")
        if not all(0 <= t < V for t in prompt):
            raise GenerationError(f"prompt token ids must be in [0, {V})", hint="the model's vocab_size is the bound")
        if not _is_int(p.max_new_tokens) or not 0 < p.max_new_tokens <= self.max_output_len:
            raise GenerationError(f"max_new_tokens = {p.max_new_tokens!r} must be an integer in "
                                  f"1..{self.max_output_len} (limits.max_output_len)",
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
        if k is not None and not (_is_int(k) and 0 <= k <= self.k_max):
            raise GenerationError(f"num_draft_tokens = {k!r} must be in 0..{self.k_max}",
                                  hint="the spec's speculative.num_draft_tokens is the maximum")
        if p.end_id is not None and not (_is_int(p.end_id) and -1 <= p.end_id < V):
            raise GenerationError(f"end_id = {p.end_id!r} must be -1 (none) or a token id in [0, {V})",
                                  hint="leave it unset for the model's EOS")
        if not isinstance(p.stop, (tuple, list)) or not all(isinstance(s, str) and s for s in p.stop):
            raise GenerationError("stop must be a sequence of non-empty strings", hint='e.g. stop=("\\n\\n",)')
        if len(p.stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in p.stop):
            raise GenerationError(f"stop: {len(p.stop)} strings of up to {max(map(len, p.stop))} characters",
                                  hint=f"at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_CHARS} "
                                       "characters each")
        if p.stop and self.tokenizer is None:
            raise GenerationError("stop strings need a tokenizer")

    def _enqueue(self, reqs: list[_Request]) -> None:
        with self._cv:
            if self._closing:
                raise GenerationError("the engine is closed")
            if self._draining:
                raise GenerationError("the server is shutting down: not accepting new requests",
                                      hint="retry against another replica or after the restart")
            self._waiting.extend(reqs)
            self._cv.notify_all()

    def _thread_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -------------------------------------------------------------------------------------------- driving

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closing and not self._waiting and not self._active:
                    self._cv.wait()
                if self._closing:
                    return
            with self._run_lock:
                self._tick()

    def _drive(self, done: Callable[[], bool]) -> None:
        while not done():
            with self._run_lock:
                self._tick()

    def _tick(self) -> None:
        """Cancellations, admissions (prefill), then one decode step for every active request."""
        new: list[_Request] = []
        try:
            for r in [r for r in self._active if r.cancelled]:
                self._finish(r, "cancelled")
            with self._cv:
                gone = [r for r in self._waiting if r.cancelled]
                self._waiting = [r for r in self._waiting if not r.cancelled]
                free = self.max_batch_size - len(self._active)
                new, self._waiting = self._waiting[:free], self._waiting[free:]
            for r in gone:
                self._finish(r, "cancelled", active=False)
            if new:
                self._prefill(new)
            if self._active:
                self._step()
        except Exception as exc:  # fail the requests in flight, keep the engine usable for the next ones
            failed = list(self._active) + [r for r in new if r.result is None and r not in self._active]
            self._active = []
            self.cache.lengths = [0] * self.cache.batch
            for r in failed:
                r.error = exc
                self._finish(r, "error", active=False)

    # ---------------------------------------------------------------------------------------- the model

    @torch.inference_mode()
    def _prefill(self, reqs: list[_Request]) -> None:
        row0, B = len(self._active), len(reqs)
        P = [len(r.prompt) for r in reqs]
        T = max(P)
        tokens = torch.tensor([r.prompt + [0] * (T - len(r.prompt)) for r in reqs], device=self.device)
        inp = chain_inputs([0] * B, T, self.device)
        last = torch.tensor([[n - 1] for n in P], device=self.device)
        logits, hidden = self.target.forward(self.cache, inp.positions, inp.start, inp.mask, tokens=tokens,
                                             row0=row0, logits_at=last)
        logits = logits[:, 0]
        for b, r in enumerate(reqs):
            self.cache.lengths[row0 + b] = P[b]
            self._active.append(r)
            self.drafter.admit(row0 + b, r, hidden[b, :P[b]])
            r.t_first = time.perf_counter()
        # tokens go out after admission, so that a request that ends at once frees its row the usual way
        self._retire([r for b, r in enumerate(reqs) if self._emit(r, [self._prefill_token(logits[b], r)])])

    def _prefill_token(self, logits: torch.Tensor, r: _Request) -> int:
        if r.params.greedy:
            return int(logits.argmax())
        return int(sample(processed_probs(logits, r.params), r.uniforms(1)[0]))

    @torch.inference_mode()
    def _step(self) -> None:
        reqs = self._active
        B = len(reqs)
        cap = load_cap(self.k_max, B)
        nodes = self.drafter.k_counts_nodes
        ks = [r.choose_k(cap, k_is_depth=not nodes) for r in reqs]
        t0 = time.perf_counter()
        drafts = self.drafter.propose(reqs, ks)  # every step, even when no row drafts (the contract)
        if nodes:  # a tree's K counts nodes: drop the ones deeper than what the request can still keep
            drafts = [d.pruned(r.room) for d, r in zip(drafts, reqs)]
        t1 = time.perf_counter()
        lengths = [len(r.seq) - 1 for r in reqs]
        T = 1 + max(len(d.tokens) for d in drafts)
        tokens = torch.tensor([[r.seq[-1]] + d.tokens + [0] * (T - 1 - len(d.tokens)) for r, d in zip(reqs, drafts)],
                              device=self.device)
        if all(_is_chain(d.parents) for d in drafts):
            inp = chain_inputs(lengths, T, self.device)
        else:
            inp = tree_inputs(lengths, [(-1,) + tuple(p + 1 for p in d.parents) for d in drafts], self.device)
        logits, hidden = self.target.forward(self.cache, inp.positions, inp.start, inp.mask, tokens=tokens)
        argmax = logits.argmax(-1).tolist() if any(r.params.greedy for r in reqs) else None
        paths, emitted = [], []
        for b, (r, d) in enumerate(zip(reqs, drafts)):
            kids = children_of(d.parents)
            n = len(d.tokens) + 1
            if r.params.greedy:
                path, nxt = verify_greedy(argmax[b][:n], d.tokens, kids)
            else:
                p = processed_probs(logits[b, :n], r.params)
                path, nxt = verify_sampled(p, d.tokens, kids, d.q, iter(r.uniforms(2 * n + 2)))
            self.cache.keep_path(b, lengths[b], [0] + [j + 1 for j in path])
            paths.append(path)
            emitted.append([d.tokens[j] for j in path] + [nxt])
        t2 = time.perf_counter()
        self.drafter.commit(reqs, paths, hidden)
        t3 = time.perf_counter()
        draft_s, verify_s = (t1 - t0) + (t3 - t2), t2 - t1
        ended = []
        for r, d, path, new in zip(list(reqs), drafts, paths, emitted):
            if r.use_adaptive and r.last_k:
                r.adaptive.update(r.last_k, len(path), d.depth)
            r.steps += 1
            if self._emit(r, new, len(d.tokens), len(path), draft_s, verify_s, step=True):
                ended.append(r)
        self._retire(ended)

    # -------------------------------------------------------------------------------- output & finishing

    def _emit(self, r: _Request, new: list[int], drafted: int = 0, accepted: int = 0, draft_s: float = 0.0,
              verify_s: float = 0.0, step: bool = False) -> bool:
        """Append new tokens through the stop conditions, send the step's event; True if the request ended."""
        out, reason = [], None
        for t in new:
            r.seq.append(t)
            out.append(t)
            if t in r.eos:
                reason = "eos"
            elif len(r.generated) >= r.params.max_new_tokens:
                reason = "length"
            if r.params.stop and self._hit_stop(r):
                reason = "stop"
            if reason:
                break
        r.drafted += drafted
        r.accepted += accepted
        r.draft_s += draft_s
        r.verify_s += verify_s
        if step:
            r.step_tokens += len(out)
        r.finish_reason = reason
        ev = StepEvent(r.id, out, self._new_text(r, final=reason is not None), drafted, accepted, draft_s, verify_s,
                       finished=reason is not None, finish_reason=reason)
        if reason:
            self._result(r)
        self._send(r, ev)
        return reason is not None

    def _hit_stop(self, r: _Request) -> bool:
        text = self.tokenizer.decode(r.generated, skip_special_tokens=True)
        hits = [i for i in (text.find(s) for s in r.params.stop) if i >= 0]
        if hits:
            r.stop_at = min(hits)
        return bool(hits)

    def _new_text(self, r: _Request, final: bool) -> str:
        if self.tokenizer is None:
            return ""
        text = self.tokenizer.decode(r.generated, skip_special_tokens=True)
        if r.stop_at is not None:
            text = text[: r.stop_at]
        if not final:
            if text.endswith("\ufffd"):
                return ""
            text = text[: len(text) - stop_prefix(text, r.params.stop)]  # may still become a stop string
        new, r.text_sent = text[r.text_sent:], max(r.text_sent, len(text))
        return new

    def _result(self, r: _Request) -> None:
        r.t_done = time.perf_counter()
        text = ""
        if self.tokenizer is not None and r.finish_reason not in ("cancelled", "error"):
            text = self.tokenizer.decode(r.generated, skip_special_tokens=True)
            if r.stop_at is not None:
                text = text[: r.stop_at]
        r.result = GenerationResult(
            request_id=r.id, prompt_tokens=len(r.prompt), tokens=list(r.generated), text=text,
            finish_reason=r.finish_reason or "error", steps=r.steps, drafted=r.drafted, accepted=r.accepted,
            acceptance_rate=r.accepted / r.drafted if r.drafted else 0.0,
            tokens_per_step=r.step_tokens / r.steps if r.steps else 0.0,
            seconds=r.t_done - r.t_submit, draft_seconds=r.draft_s, verify_seconds=r.verify_s,
            ttft_seconds=(r.t_first or r.t_done) - r.t_submit)

    def _send(self, r: _Request, ev: StepEvent) -> None:
        try:
            r.on_event(ev)
        except Exception:  # a failing consumer cancels its own request, not the engine
            r.cancelled = True

    def _retire(self, ended: list[_Request]) -> None:
        """Free the rows of finished requests, keeping active rows dense (the last row moves into the hole)."""
        for i in sorted((self._active.index(r) for r in ended if r in self._active), reverse=True):
            last = len(self._active) - 1
            if i != last:
                self.cache.move_row(last, i)
                self.drafter.move_row(last, i)
                self._active[i] = self._active[last]
            else:
                self.cache.lengths[i] = 0
            self._active.pop()

    def _finish(self, r: _Request, reason: str, active: bool = True) -> None:
        r.finish_reason = reason
        self._result(r)
        self._send(r, StepEvent(r.id, [], "", finished=True, finish_reason=reason,
                                error=None if r.error is None else f"{type(r.error).__name__}: {r.error}"))
        if active and r in self._active:
            self._retire([r])


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _token_ids(prompt) -> list[int]:
    """Token ids as ints (Python, numpy or 0-d integer tensors); anything else is a GenerationError."""
    try:
        return [operator.index(t) for t in prompt]
    except TypeError:
        raise GenerationError("a prompt must be text or a sequence of integer token ids",
                              hint=f"got {type(prompt).__name__}") from None


def stop_prefix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of `text` that is a proper prefix of a stop string: streamed text holds it
    back, since the next tokens may complete the stop string (which is never sent)."""
    n = 0
    for s in stops:
        for m in range(min(len(s) - 1, len(text)), n, -1):
            if text.endswith(s[:m]):
                n = m
                break
    return n


def _is_chain(parents: tuple[int, ...]) -> bool:
    return all(p == i - 1 for i, p in enumerate(parents))
