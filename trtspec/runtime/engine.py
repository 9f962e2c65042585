"""SpecEngine: the reference speculative-decoding runtime (torch), with continuous batching.

The pieces, as vLLM v1 splits them: scheduler.py decides which requests run (queue, admission, the background
thread, cancellation, drain); request.py is one request's state and adaptive.py its K; proposer.py + the
methods' proposers (trtspec/methods/) propose drafts; rejection.py accepts them; detok.py turns tokens into text
and stops at stop strings; stats.py counts. This module holds the API and the model runner: the prefill and
the speculative step, one screen each (`step` below), which follow speculative sampling (arXiv 2211.17192,
2302.01318):

  1. choose K per request (adaptive: recent acceptance, a cap by load, fallback to plain decoding);
  2. the proposer proposes a chain or tree per request;
  3. the target verifies all of them in ONE forward pass: per row [pending token, draft nodes...], padded,
     each row at its own cache length, with a causal or tree mask;
  4. the rejection sampler accepts a path per row (token identity when greedy, min(1, p/q) when sampling);
  5. each row's cache length moves past the kept entries only, and the proposer commits;
  6. the new tokens go through the stop conditions; the step's SpecDecodingStats go to `on_step`
     observers, then each request's StepEvent to its consumer.
"""
from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import torch

from trtspec.artifacts.tokenizer import load_tokenizer
from trtspec.errors import GenerationError
from trtspec.runtime import costs as cost_table
from trtspec.runtime.adaptive import AdaptiveConfig, Price, SharedAcceptance, load_cap, together
from trtspec.runtime.cache import chain_inputs, draft_inputs
from trtspec.runtime.costs import CostTable
from trtspec.runtime.llama import Llama
from trtspec.runtime.loaded import load_model, new_cache
from trtspec.runtime.proposer import ProposalBatch, Proposer
from trtspec.runtime.rejection import rejection_sample
from trtspec.runtime.request import GenerationResult, Request, StepEvent, token_ids, validate
from trtspec.runtime.router import RoutedProposer
from trtspec.runtime.sampling import SamplingParams, sample_token
from trtspec.runtime.scheduler import Scheduler
from trtspec.runtime.stats import SpecDecodingStats
from trtspec.spec import schedule_k

__all__ = ["SpecEngine", "StepEvent", "GenerationResult", "AdaptiveConfig"]
log = logging.getLogger(__name__)


class SpecEngine:
    """Speculative decoding with a target Llama and a proposer; see the module docstring."""

    def __init__(self, target: Llama, proposer: Proposer | None = None, tokenizer=None, *, max_batch_size: int = 4,
                 max_input_len: int = 512, max_output_len: int = 256, num_draft_tokens: int = 4,
                 adaptive: AdaptiveConfig = AdaptiveConfig(), name: str = "model", costs: CostTable | None = None,
                 schedule: dict[int, int] | None = None, draft_quantization: str | None = None):
        self.schedule = dict(schedule) if schedule else None  # K by batch size (spec.schedule_k); None: load_cap
        self.target, self.proposer, self.tokenizer, self.name = target, proposer or Proposer(), tokenizer, name
        self.max_batch_size, self.max_input_len, self.max_output_len = max_batch_size, max_input_len, max_output_len
        self.adaptive, self.device = adaptive, target.device
        # slots: prompt + output + one step's draft nodes past the end (+ the pending token)
        self.max_rows = self.proposer.max_nodes(num_draft_tokens) + 1  # the most rows one request verifies
        self.max_seq = max_input_len + max_output_len + self.max_rows + 1
        target.set_max_seq(self.max_seq)
        self.cache = new_cache(target, max_batch_size, self.max_seq)  # (refused first if it would not fit)
        self.plan = self.proposer.setup(target, max_batch_size, self.max_seq, num_draft_tokens)
        self.draft_quantization = draft_quantization  # weight-only, the drafter's linears only (runtime/quant.py)
        if draft_quantization:
            from trtspec.runtime.quant import quantize_proposer

            self.quantized_linears = quantize_proposer(self.proposer, draft_quantization, target)
        self.k_max = self.plan.k_max
        # a routed spec (runtime/router.py): each request uses one of several drafters, with that drafter's plan
        self.routed = isinstance(self.proposer, RoutedProposer)
        self.plans = self.proposer.plans if self.routed else [self.plan]
        self.drafter_names = list(self.proposer.names) if self.routed else []
        # each drafter's acceptance over its recent greedy and unseeded requests: a new one's price under load
        self.shared = [SharedAcceptance(least=adaptive.history) for _ in self.plans]
        self.method = self.proposer.name if self.k_max > 0 else "none"  # a method's name (trtspec.methods)
        eos = set(target.cfg.eos_token_ids)
        if tokenizer is not None and getattr(tokenizer, "eos_token_id", None) is not None:
            eos.add(int(tokenizer.eos_token_id))
        self.eos_ids = frozenset(eos)
        self.on_step: list[Callable[[SpecDecodingStats], None]] = []  # called on the stepping thread, per step
        self.scheduler = Scheduler(max_batch_size, self)
        # what a step costs here (costs.py): injected (the argument, else TRTSPEC_COST_TABLE), else measured now
        self.prices = [Price(lambda n: 1.0)] * len(self.plans)  # (calibration's requests run at a fixed K)
        self.costs = costs or cost_table.from_env() or cost_table.calibrate(self, self.drafters)
        self.prices = [Price(self.costs.verify_seconds, functools.partial(self.costs.draft_seconds, d), p.fixed_rows,
                             p.width, self.costs.catch_up_seconds(d))
                       for d, p in zip(self.drafters or [self.method], self.plans)]

    @classmethod
    def from_spec(cls, spec, proposer: Proposer, tokenizer=None, *, num_draft_tokens: int | None = None,
                  costs: CostTable | None = None) -> "SpecEngine":
        """Load the target and the tokenizer as `spec` (trtspec.spec.Spec) says, around `proposer`: the spec's
        method's, made by the caller (trtspec.methods.engine composes the two). `num_draft_tokens`: K (None: the
        spec's; 0 for a method that drafts nothing); `costs`: an injected cost table (None: see __init__)."""
        if spec.runtime.torch.threads:
            torch.set_num_threads(spec.runtime.torch.threads)
        lim = spec.limits
        row_exact = spec.runtime.torch.row_exact
        # quantized as it loads (before the proposer's setup: drafters that reuse the head get this one), row-exact
        # by default when quantized (torch's int8 kernel's bf16 activations need it); one copy per process
        # (runtime/loaded.py)
        target = load_model(spec.model.target, dtype=spec.model.dtype, device=spec.runtime.device,
                            max_seq=lim.max_seq_len, name="target", quantization=spec.model.quantization,
                            row_exact=spec.model.quantization is not None if row_exact is None else row_exact)
        if tokenizer is None:
            tokenizer = load_tokenizer(spec.tokenizer_dir)
        a = spec.speculative.adaptive
        k = spec.speculative.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
        return cls(target, proposer, tokenizer, max_batch_size=lim.max_batch_size,
                   max_input_len=lim.max_input_len, max_output_len=lim.max_output_len, num_draft_tokens=k,
                   adaptive=AdaptiveConfig(a.enabled, a.min_draft_tokens, a.history, a.fallback_acceptance),
                   name=spec.model.name, schedule=spec.speculative.schedule,
                   draft_quantization=spec.speculative.draft_quantization, costs=costs)

    # ------------------------------------------------------------------------------------------------ API

    def generate(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
                 task: str | None = None) -> GenerationResult:
        return self.generate_batch([prompt], params, None if task is None else [task])[0]

    def generate_batch(self, prompts: Sequence[str | Sequence[int]],
                       params: SamplingParams | Sequence[SamplingParams] | None = None,
                       tasks: Sequence[str | None] | None = None) -> list[GenerationResult]:
        """Decode several prompts together (up to max_batch_size at once, the rest as rows free up). `tasks`: per
        prompt, the task that picks its drafter in a routed engine (None: the router decides; see `route`)."""
        plist = list(params) if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise GenerationError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        tlist = list(tasks) if tasks is not None else [None] * len(prompts)
        if len(tlist) != len(prompts):
            raise GenerationError(f"{len(prompts)} prompts but {len(tlist)} tasks")
        done = threading.Event()
        reqs: list[Request] = []

        def on_event(ev: StepEvent) -> None:
            if ev.finished and all(r.result is not None for r in reqs):
                done.set()

        reqs.extend(self._make(self._encode(p), sp, on_event, t) for p, sp, t in zip(prompts, plist, tlist))
        self.scheduler.enqueue(reqs)
        if self.scheduler.running:  # the background thread drives; wait for our requests
            done.wait()
        else:
            self.scheduler.drive(done.is_set)
        for r in reqs:
            if r.error is not None:
                raise r.error
        return [r.result for r in reqs]

    def stream(self, prompt: str | Sequence[int], params: SamplingParams | None = None,
               task: str | None = None) -> Iterator[StepEvent]:
        """Events of one request as its steps happen (the first carries the prefill's token)."""
        events: queue.SimpleQueue[StepEvent] = queue.SimpleQueue()
        req = self._make(self._encode(prompt), params or SamplingParams(), events.put, task)
        self.scheduler.enqueue([req])
        finished = False
        try:
            while True:
                try:
                    ev = events.get_nowait()
                except queue.Empty:
                    if self.scheduler.running:
                        ev = events.get()
                    else:
                        self.scheduler.drive(lambda: not events.empty())
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
                if not self.scheduler.running:
                    self.scheduler.tick()

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None, on_event: Callable[[StepEvent], None],
               task: str | None = None) -> str:
        """Queue a request for the background scheduler thread; events go to on_event (called on that thread).
        Invalid requests (an unknown task of a routed engine too) raise GenerationError here."""
        req = self._make(token_ids(prompt_ids), params or SamplingParams(), on_event, task)
        self.scheduler.enqueue([req])
        self.scheduler.start()
        return req.id

    def cancel(self, request_id: str) -> None:
        self.scheduler.cancel(request_id)

    def close(self) -> None:
        self.scheduler.close()

    def drain(self, deadline: float, refuse_new: bool = True, on_idle: Callable[[], None] | None = None,
              poll: float = 0.05) -> bool:
        """Graceful shutdown: let the requests in flight run until `deadline` (a time.monotonic() value), then
        end the ones still running with a final event whose finish_reason is "shutdown" (their clients get a
        clean end, not a hung stream). With `refuse_new` new requests are refused at once and it returns
        as soon as nothing runs; without, requests admitted upstream may still arrive, so it keeps to the
        deadline. `on_idle` is called the first time nothing runs. True if nothing had to be cut."""
        return self.scheduler.drain(deadline, refuse_new, on_idle, poll)

    @property
    def drafters(self) -> list[str]:
        """Each drafter's name, as the cost table and the served metrics label it (one per plan, in order): a
        routed spec's drafters, else the method's name; none where nothing drafts (K = 0)."""
        return (self.drafter_names or [self.method]) if self.k_max > 0 else []

    @property
    def num_active(self) -> int:
        return len(self.scheduler.active)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def _encode(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise GenerationError("this engine has no tokenizer: pass token ids")
            return list(self.tokenizer(prompt)["input_ids"])
        return token_ids(prompt)

    def route(self, prompt: Sequence[int], task: str | None = None) -> int:
        """The drafter (an index into drafter_names) a request would use: its task, else the router's kind (the
        classifier reads the decoded prompt). 0 in an engine that is not routed, whatever the task: one drafter
        serves every task there. GenerationError for a task the router does not know."""
        if not self.routed:
            return 0

        def text() -> str:
            if self.tokenizer is None:
                return ""
            return self.tokenizer.decode(list(prompt), skip_special_tokens=True)  # no chat-template markup

        return self.proposer.router.choose(task, text)

    def _make(self, prompt: list[int], params: SamplingParams, on_event, task: str | None = None) -> Request:
        drafter = self.route(prompt, task)
        plan = self.plans[drafter]
        validate(prompt, params, vocab=self.target.cfg.vocab_size, max_input_len=self.max_input_len,
                 max_output_len=self.max_output_len, k_max=plan.k_max, tokenizer=self.tokenizer)
        eos = self.eos_ids
        if params.end_id is not None:
            eos = frozenset([params.end_id]) if params.end_id >= 0 else frozenset()
        req = Request(prompt, params, on_event, eos, plan.k_max, self.adaptive, plan.options, self.prices[drafter],
                      self.tokenizer, self.shared[drafter])
        req.drafter = drafter
        return req

    # ----------------------------------------------------------------------- the model runner (scheduler.Runner)

    @torch.inference_mode()
    def prefill(self, reqs: list[Request], row0: int) -> list[Request]:
        """Run new requests' prompts in one pass into rows row0..; send each its first token."""
        B, P = len(reqs), [len(r.prompt) for r in reqs]
        T = max(P)
        tokens = torch.tensor([r.prompt + [0] * (T - len(r.prompt)) for r in reqs], device=self.device)
        inp = chain_inputs([0] * B, T, self.device)
        last = torch.tensor([[n - 1] for n in P], device=self.device)
        logits, hidden = self.target.forward(self.cache, inp.positions, inp.start, inp.mask, tokens=tokens,
                                             row0=row0, logits_at=last)
        for b, r in enumerate(reqs):
            self.cache.lengths[row0 + b] = P[b]
            if self.routed:  # the row's drafter, chosen when the request was made
                self.proposer.assign(row0 + b, r.drafter)
            self.proposer.admit(row0 + b, hidden[b, :P[b]])
            r.t_first = time.perf_counter()
        return [r for b, r in enumerate(reqs) if r.send(r.extend([sample_token(logits[b, 0], r.params, r.uniforms)]))]

    @torch.inference_mode()
    def step(self, reqs: list[Request]) -> list[Request]:
        """One speculative step for every active request (row b = reqs[b]); returns the ones that ended."""
        plans = [self.plans[r.drafter] for r in reqs]
        params = [r.params for r in reqs]
        draws = [r.uniforms for r in reqs]
        # 1. K per request, then priced together (one padded pass verifies them all)
        ks = [r.choose_k(self.load_cap(len(reqs), p.k_max), p.k_is_depth, len(reqs)) for r, p in zip(reqs, plans)]
        if any(ks):
            ks = self._cap_together(reqs, self._paying_back(reqs, ks))
        # 2. propose (a tree's K counted nodes: drop what is deeper than its request can keep)
        t0 = time.perf_counter()
        drafts = self.proposer.propose(ProposalBatch([r.seq for r in reqs], params, ks, draws))
        drafts = [d if p.k_is_depth else d.pruned(r.room) for d, r, p in zip(drafts, reqs, plans)]
        t1 = time.perf_counter()
        # 3. verify: row b = [pending token, draft nodes, branch inputs], padded, in ONE target pass
        lengths = [len(r.seq) - 1 for r in reqs]
        tokens, inp = self._verify_inputs(reqs, drafts, lengths)  # tokens [B, T]
        logits, hidden = self.target.forward(self.cache, inp.positions, inp.start, inp.mask, tokens=tokens)
        # logits [B, T, V], hidden [B, T, H]
        # 4. accept: a path of draft nodes per row, and the tokens it emits
        paths, emitted = rejection_sample(logits, drafts, params, draws)
        # 5. commit: each row's cache keeps the pending token and its accepted path
        for b, path in enumerate(paths):
            self.cache.keep_path(b, lengths[b], [0] + [j + 1 for j in path])
        t2 = time.perf_counter()
        if any(d.branch is not None for d in drafts):
            self.proposer.commit_branch(_branch_outputs(logits, drafts))
        self.proposer.commit(paths, hidden)
        t3 = time.perf_counter()
        # 6. emit: adaptive K learns, the stop conditions cut, the observers get the stats, then the events
        depths = [_tested_depth(d) for d in drafts]
        for r, path, depth, d in zip(reqs, paths, depths, drafts):
            r.learn(len(path), depth, len(d.tokens))
        kept = [r.extend(new) for r, new in zip(reqs, emitted)]
        draft_s = (t1 - t0) + (t3 - t2)
        verify_s = t2 - t1
        self._observe(reqs, drafts, depths, paths, kept, draft_s, verify_s)
        return [r for r, d, path, out in zip(list(reqs), drafts, paths, kept)
                if r.send(out, len(d.tokens), len(path), draft_s, verify_s)]

    def _paying_back(self, reqs: list[Request], ks: list[int]) -> list[int]:
        """No draft for an adaptive request whose drafter lags it by more tokens than drafting its remaining
        tokens could pay back, every draft accepted (Price.pays_back at α = 1: a probe tests a low acceptance
        and must not be priced by it): a draft model's cache falls behind while its request decodes plainly, and
        catching up a long backlog for a request about to end cost a batch of four ~15 decode steps (the W4A8
        Qwen pair, docs/qwen.md). Seeded sampled and fixed-K requests keep theirs."""
        out = []
        for b, (r, k) in enumerate(zip(reqs, ks)):
            a = r.adaptive
            if k and r.follows_batch and a.price.catch_up:
                lag = self.proposer.lag(b, len(r.seq))
                gain = a.price.speedup(1.0, k, a.depth_of(k), len(reqs), a.width)
                if lag and not a.price.pays_back(lag, r.room + 1, gain, len(reqs)):
                    k = r.last_k = 0
            out.append(k)
        return out

    def _cap_together(self, reqs: list[Request], ks: list[int]) -> list[int]:
        """The budgets of a step of several requests, priced together (adaptive.together): each request chose its
        own K as if the others drafted alike; a step of mixed budgets pads every row to the longest draft, so the
        adaptive requests' budgets are capped at the cap with the best priced step (0: no drafts, when none
        pays). Seeded sampled and fixed-K requests keep theirs (their K never follows the batch)."""
        free = [r.follows_batch for r in reqs]
        caps = sorted({0, *(k for k, f in zip(ks, free) if f)}, reverse=True)
        if len(reqs) == 1 or caps == [0]:
            return ks
        choose = [[min(k, c) if f else k for k, f in zip(ks, free)] for c in caps]
        gains = [together([(r.adaptive, k) for r, k in zip(reqs, option)]) for option in choose]
        best = choose[max(range(len(caps)), key=lambda i: (gains[i], i))]  # ties: the smaller cap
        for r, k in zip(reqs, best):
            r.last_k = k  # what it learns from (0: nothing; a probe that was cut waits for the next step)
        return best

    def _verify_inputs(self, reqs: list[Request], drafts: list, lengths: list[int]):
        """The verify pass's tokens [B, T] (row b: the pending token, its draft nodes, its branch inputs, then
        padding) and its positions/mask (cache.draft_inputs)."""
        branches = [d.branch for d in drafts]  # inputs run and never kept (lookahead's window), after the nodes
        rows = [d.tokens + (list(br.tokens) if br is not None else []) for d, br in zip(drafts, branches)]
        T = 1 + max(len(x) for x in rows)
        tokens = [[r.seq[-1]] + x + [0] * (T - 1 - len(x)) for r, x in zip(reqs, rows)]
        inp = draft_inputs(lengths, [d.parents for d in drafts], T, self.device, branches)
        return torch.tensor(tokens, device=self.device), inp  # [B, T]

    def _observe(self, reqs: list[Request], drafts: list, depths: list[int], paths: list[list[int]],
                 kept: list[list[int]], draft_s: float, verify_s: float) -> None:
        """The step's SpecDecodingStats to the on_step observers (before the events: whoever reads both sees
        the stats first); an observer that fails does not fail the requests."""
        stats = SpecDecodingStats(depths, [len(d.tokens) for d in drafts], [len(p) for p in paths],
                                  [len(k) for k in kept], draft_s, verify_s,
                                  [r.drafter for r in reqs] if self.routed else [])
        for observe in self.on_step:
            try:
                observe(stats)
            except Exception:
                log.exception("trtspec: an on_step observer failed")

    def load_cap(self, batch: int, k_max: int | None = None) -> int:
        """The cap on K for a step of `batch` requests: the spec's schedule (its band for the batch size), else
        adaptive.load_cap. Like load_cap it caps adaptive K of greedy and unseeded requests only. `k_max`: the
        request's drafter's (a routed engine), else the engine's."""
        k_max = self.k_max if k_max is None else k_max
        return schedule_k(self.schedule, k_max, batch) if self.schedule else load_cap(k_max, batch)

    def move_row(self, src: int, dst: int) -> None:
        self.proposer.release(dst)  # the scheduler moves the last row into a finished request's row
        self.cache.move_row(src, dst)
        self.proposer.move_row(src, dst)

    def free_row(self, row: int) -> None:
        self.proposer.release(row)
        self.cache.lengths[row] = 0

    def reset(self) -> None:
        self.cache.lengths = [0] * self.cache.batch
        if self.routed:
            self.proposer.clear()


def _tested_depth(d) -> int:
    """The depth adaptive K learns from: a branch costs its rows whether or not it found candidates, so a step
    that ran one is a tested draft (a branch that does not pay off falls back like any other drafter)."""
    return max(d.depth, 1) if d.branch is not None else d.depth


def _branch_outputs(logits: torch.Tensor, drafts) -> list[list[int] | None]:
    """Per row with a branch: the target's argmax at the pending token and at each branch input (logits
    [B, T, V])."""
    out: list[list[int] | None] = []
    for b, d in enumerate(drafts):
        if d.branch is None:
            out.append(None)
            continue
        n, m = len(d.tokens), len(d.branch.tokens)
        out.append([int(logits[b, 0].argmax())] + logits[b, 1 + n:1 + n + m].argmax(-1).tolist())
    return out
