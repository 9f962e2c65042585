"""Adaptive K: how many draft tokens each request drafts this step, priced by what the step costs on this
device (costs.py), and the cap on K by the load (load_cap).

A step that drafts a budget K (chain: K tokens; tree: K nodes) of depth d verifies `rows` rows per request,
and costs at batch B (every request priced as drafting what this one does: the batch's rows in all, and d draft
steps of B requests together)

    verify(B * rows) + d * draft(B)     against   verify(B)  for a plain decoding step,

and emits E[tau](alpha, d) = (1 - alpha^(d+1)) / (1 - alpha) tokens per request on average (i.i.d. acceptance
alpha per token; arXiv 2211.17192, eq. 1). The expected speedup of the option is therefore

    E[tau](alpha, d) * verify(B) / (verify(B * rows) + d * draft(B)),

adaptive K drafts the option that maximises it, and only while that maximum exceeds 1: a drafter whose draft
step costs as much as a decode step (c = draft / verify(1) = 1) can never pay and never drafts.
rows = 1 + fixed_rows + width * K: the pending token, the rows a drafting step runs whatever K (lookahead's
window) and the draft nodes, `width` per unit of K (1 for a chain; learned from the nodes a request's drafter
really proposed, so n-gram tries of several continuations, or continuations shorter than K, are priced as
verified).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    enabled: bool = True
    min_draft_tokens: int = 1
    history: int = 8
    fallback_acceptance: float = 0.0  # an optional floor on acceptance below which a request decodes plainly


@dataclasses.dataclass(frozen=True)
class Price:
    """What one request's drafter costs (see the module docstring): verify(n) seconds of a target pass over n
    rows in all, draft(B) seconds of one draft step of B requests together (a number: the same at every B), the
    rows its draft of budget K adds: fixed_rows + width * K (width: a prior until the request's own drafts
    teach it), and what catching up costs per token (`pays_back`)."""

    verify: Callable[[float], float]
    draft: float | Callable[[int], float] = 0.0
    fixed_rows: int = 0
    width: float = 1.0
    catch_up: float = 0.0  # seconds per token the drafter takes to catch up a request it has not followed

    def draft_seconds(self, batch: int = 1) -> float:
        return self.draft(batch) if callable(self.draft) else self.draft

    def rows(self, budget: int, width: float | None = None) -> float:
        """Rows one request verifies drafting `budget`: the pending token, fixed_rows and width per unit of K."""
        return 1 + self.fixed_rows + (self.width if width is None else width) * budget

    def speedup(self, alpha: float, budget: int, depth: int, batch: int = 1, width: float | None = None) -> float:
        """The expected speedup over plain decoding of drafting (budget, depth) at batch `batch`."""
        cost = self.verify(batch * self.rows(budget, width)) + depth * self.draft_seconds(batch)
        return expected_tokens(alpha, depth) * self.verify(batch) / cost

    def pays_back(self, lag: int, tokens: int, speedup: float, batch: int = 1) -> bool:
        """Whether drafting at `speedup` for the `tokens` a request can still generate saves more than its
        drafter's catch-up of `lag` tokens costs: tokens * verify(B) * (1 - 1/speedup) > lag * catch_up."""
        saved = tokens * self.verify(batch) * (1.0 - 1.0 / speedup) if speedup > 1.0 else 0.0
        return lag * self.catch_up < saved


def nominal(draft: float = 0.15, row: float = 0.0) -> Price:
    """A price in units of one decode step: each draft step costs `draft` of it, each verify row past the
    first `row` of it (tests and synthetic tables)."""
    return Price(lambda n: 1.0 + row * (n - 1), draft)


def expected_tokens(alpha: float, depth: int) -> float:
    """E[tokens/step] = (1 - α^(K+1)) / (1 - α) for K = depth i.i.d. drafts (arXiv 2211.17192, eq. 1)."""
    return depth + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (depth + 1)) / (1.0 - alpha)


def best(alpha: float, options: Sequence[tuple[int, int]], price: Price, batch: int = 1,
         width: float | None = None) -> tuple[int, float]:
    """(budget, expected speedup) of the option (budget, depth) with the largest expected speedup (ties: the
    smaller budget)."""
    choice, gain = options[0][0], -math.inf
    for budget, depth in options:
        g = price.speedup(alpha, budget, depth, batch, width)
        if g > gain + 1e-9:
            choice, gain = budget, g
    return choice, gain


class SharedAcceptance:
    """The acceptance of one drafter's recent requests, pooled over all of them (an EMA over ~`span` request-steps,
    pooled as AdaptiveK pools one request's): what a new request (no acceptance of its own yet) prices a step of
    several requests at, instead of α = 1 (AdaptiveK.shared_alpha). None until `least` request-steps have fed it
    (one step's few drafts are not an estimate), and again once `patience` new requests in a row waited on it
    (their drafter is then tested again at α = 1, so a drafter priced off under load is not off for good: its
    requests' acceptance may have changed; 16x the span, as a request's own plain stretch is at most 16x its
    history: at 64, the demo pair's closed loop of 16 clients forgot it every 64 requests and ran as without it).
    Only greedy and unseeded requests read and feed it: their K may follow what else runs; a seeded sampled
    request's must not (Request.follows_batch)."""

    def __init__(self, span: int = 64, least: int = 8, patience: int = 1024):
        self.weight, self.least, self.patience = 2.0 / (span + 1), least, patience
        self.acc = self.trials = 0.0
        self.count = 0
        self.waited = 0  # new requests that waited on it since it was last fed
        self.priced_off = 0  # new requests that waited on it in all (an operator's count: the served metrics)

    @property
    def alpha(self) -> float | None:
        return self.acc / self.trials if self.count >= self.least and self.waited < self.patience else None

    def wait(self) -> None:
        """One more new request waited on it (priced off at its batch): see `patience`."""
        self.waited += 1
        self.priced_off += 1

    def add(self, accepted: int, trials: int) -> None:
        """One request-step's accepted drafts and drafts tested (trials >= 1): the mean of the first ones, then the
        EMA (each first step would otherwise weigh as much as the span)."""
        self.count += 1
        self.waited = 0
        w = max(self.weight, 1.0 / self.count)
        self.acc += w * (accepted - self.acc)
        self.trials += w * (trials - self.trials)


def best_option(alpha: float, options: Sequence[tuple[int, int]], price: Price, batch: int = 1) -> int:
    """The budget of `best`."""
    return best(alpha, options, price, batch)[0]


class AdaptiveK:
    """Draft length of one request from its recent acceptance, priced (see the module docstring).

    α̂: per-token acceptance over the last ~`history` steps (EMA span): EMA(accepted) / EMA(drafts tested),
    where a step tests its accepted drafts plus the one rejected, if any. Before the first estimate it
    assumes α = 1 (so a drafter that cannot pay even then never drafts). Each step drafts the option that
    maximises the expected speedup at the step's batch, or nothing when no option's exceeds 1 there (while
    α̂ rests on fewer than `history` steps and only a low α̂ is why, it keeps testing with the option best at
    batch 1, so one bad first step does not switch a drafter off). When, after `history` steps, no option pays
    at batch 1 (or α̂ is below the optional floor `fallback`), the
    request decodes plainly for `history` steps, twice as long after each probe that failed in a row (up
    to 16x), then probes once with the smallest option; the probe's acceptance restarts α̂. At a batch where no
    option would pay even at α = 1 it drafts nothing, neither tests nor probes (a probe waits for a batch where
    it could turn drafting on): such a probe cost the whole batch its padded rows and a drafter's catch-up, and
    taught nothing that batch could use (the W4A8 Qwen pair at 4 concurrent requests, docs/qwen.md). For the same
    reason, at a batch of several requests a request with no acceptance of its own yet is priced at its drafter's
    acceptance shared among greedy and unseeded requests (`shared`, once known) instead of α = 1: under load every
    new request of the demo pair tested K = 1 at 16 requests at α = 1, where the drafter's 0.7 does not pay
    (docs/costs.md). Once it has one, it tests a low first estimate as above. Deterministic given the acceptance
    history and the price (the cost table is fixed once measured), so seeded sampling stays reproducible (a seeded
    sampled request has no `shared`).
    """

    def __init__(self, options: Sequence[tuple[int, int]], cfg: AdaptiveConfig, price: Price,
                 shared: SharedAcceptance | None = None):
        k_max = max((b for b, _ in options), default=0)
        self.k_max, self.price = k_max, price
        self.options = sorted(o for o in options if o[0] >= min(cfg.min_draft_tokens, k_max)) or [(0, 0)]
        self.k_min = self.options[0][0]
        self.history, self.fallback = cfg.history, cfg.fallback_acceptance
        self.weight = 2.0 / (cfg.history + 1)
        self.alpha: float | None = None
        self.width = price.width  # rows per unit of K, learned from the drafts (the prior until then)
        self.acc = self.trials = 0.0
        self.steps, self.off, self.probing = 0, 0, False
        self.failed_probes = 0  # in a row
        self.shared = shared  # its drafter's acceptance over recent requests (None: priced at α = 1 until its own)
        self.waited = False  # whether it waited on the shared acceptance (counted there once)
        # the module's best() by (alpha, batch), kept while the estimates and the width stay (they change only in
        # update()s): priced at every step of every request, up to three times (at its batch, alone, at alpha = 1)
        self._priced: tuple[tuple | None, dict[tuple[float, int], tuple[int, float]]] = (None, {})

    def _best_at(self, alpha: float, batch: int) -> tuple[int, float]:
        key = (self.alpha, self.width, self.shared_alpha)
        if self._priced[0] != key:
            self._priced = key, {}
        memo = self._priced[1]
        if (alpha, batch) not in memo:
            memo[alpha, batch] = best(alpha, self.options, self.price, batch, self.width)
        return memo[alpha, batch]

    def best(self, batch: int = 1) -> tuple[int, float]:
        """(budget, expected speedup) of the best option at `batch` for the acceptance seen so far."""
        if self.k_max == 0:
            return 0, 1.0
        shared = self.shared_alpha if batch > 1 else None
        return self._best_at(shared if shared is not None else 1.0 if self.alpha is None else self.alpha, batch)

    @property
    def k(self) -> int:
        """The budget drafted at batch 1 outside a probe or a plain stretch (0: none pays)."""
        budget, gain = self.best()
        return budget if gain > 1.0 else 0

    def pays(self, batch: int = 1) -> bool:
        """Whether the best option's expected speedup exceeds 1 at `batch`."""
        return self.best(batch)[1] > 1.0

    @property
    def shared_alpha(self) -> float | None:
        """The drafter's shared acceptance where this request prices a step of several requests at it: while it
        has no estimate of its own (None: no shared acceptance known, or its own)."""
        s = self.shared
        return s.alpha if s is not None and self.alpha is None else None

    @property
    def exploring_alpha(self) -> float:
        """The acceptance a step of several requests prices this request's draft at: α̂, the drafter's shared
        acceptance while the request has no estimate of its own, or 1 while it explores without one (no estimate
        yet, a low first estimate still being tested, a probe)."""
        shared = self.shared_alpha
        if shared is not None:
            return shared
        return 1.0 if self.alpha is None or self.probing or self.steps < self.history else self.alpha

    def depth_of(self, budget: int) -> int:
        """The depth of a draft of `budget` (a budget between options: the largest option's within it)."""
        return max((d for b, d in self.options if b <= budget), default=min(budget, 1))

    def could_pay(self, batch: int = 1) -> bool:
        """Whether any option would pay at `batch` with every draft accepted (α = 1)."""
        return self.k_max > 0 and self._best_at(1.0, batch)[1] > 1.0

    def next_k(self, batch: int = 1) -> int:
        if self.off > 0:
            self.off -= 1
            self.probing = self.off == 0
            return 0
        if batch > 1 and self.shared_alpha is not None:  # priced at its drafter's: drafts where that pays, else waits
            budget, gain = self.best(batch)
            if gain > 1.0:
                return budget
            if not self.waited:  # counted once a request
                self.waited = True
                self.shared.wait()
            return 0
        if not self.could_pay(batch):  # nothing to learn at this batch: no probe, no test (they wait for a smaller one)
            return 0
        if self.probing:
            return self.k_min
        budget, gain = self.best(batch)
        if gain > 1.0:
            return budget
        if self.pays():  # pays alone but not at this batch (no estimate yet: could_pay decided above)
            return 0
        # α̂ rests on fewer than `history` steps: keep testing with the best option (`update` decides after)
        return self.best()[0] if self.steps < self.history else 0

    def update(self, k: int, accepted: int, depth: int, nodes: int | None = None) -> None:
        """One step's outcome: budget k, the accepted path's length, the draft's depth and its nodes (rows)."""
        if k == 0 or depth == 0:
            return
        if nodes:
            w = nodes / k  # rows per unit of K this draft really had
            self.width = w if self.alpha is None else self.width + self.weight * (w - self.width)
        trials = accepted + (1 if accepted < depth else 0)  # drafts tested: the accepted ones and the rejected one
        if self.shared is not None:
            self.shared.add(accepted, trials)
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
            # plain decoding for a while, backing off while probes keep failing: each failed probe doubles
            # the plain stretch (at most 16x), so probing costs a few % at most
            self.failed_probes = self.failed_probes + 1 if probe else 0
            self.off = self.history << min(self.failed_probes, 4)
        elif probe:
            self.failed_probes = 0


def together(choices: Sequence[tuple[AdaptiveK, int]]) -> float:
    """The expected speedup over plain decoding of one step in which each of the batch's requests drafts its own
    budget (choices: a request's AdaptiveK and its budget, 0 for none): every row padded to the longest, every
    drafter stepping as deep as the deepest draft, each request emitting its own E[tau] (1 without a draft).
    Every request prices as if the others drafted what it does (Price.speedup); this is what a step of mixed
    budgets costs: one request's probe among three plain rows pays the padded rows and the batch's draft steps
    for one request's tokens. A request that explores (a probe, a test) counts at α = 1, what it tests being
    whether its acceptance is higher than its estimate, or at its drafter's shared acceptance where it is priced
    at that (AdaptiveK.exploring_alpha)."""
    batch = len(choices)
    tokens, rows, draft = 0.0, 1.0, 0.0
    for a, k in choices:
        if k <= 0:
            tokens += 1.0
            continue
        depth = a.depth_of(k)
        tokens += expected_tokens(a.exploring_alpha, depth)
        rows = max(rows, a.price.rows(k, a.width))
        draft = max(draft, depth * a.price.draft_seconds(batch))
    verify = choices[0][0].price.verify
    return tokens / batch * verify(batch) / (verify(batch * rows) + draft)


def load_cap(k_max: int, active: int) -> int:
    """Global cap on K by load (a draft_len_schedule): K at 1-2 requests, then shrinking as ~2K/(n+1). Not for
    seeded sampled requests: their K decides how many of their own random numbers a step draws, so a K that
    followed the load would make their output depend on what else runs (see Request.choose_k)."""
    return k_max if active <= 2 else max(1, -(-2 * k_max // (active + 1)))
