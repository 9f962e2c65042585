"""Adaptive K: how many draft tokens each request drafts this step, from its recent acceptance (AdaptiveK),
and the cap on K by the load (load_cap)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

DRAFT_COST = 0.15  # c: one draft token's cost in target decode steps (draft pass + verify growth; CPU-typical)


@dataclasses.dataclass(frozen=True)
class AdaptiveConfig:
    enabled: bool = True
    min_draft_tokens: int = 1
    history: int = 8
    fallback_acceptance: float = 0.2


def expected_tokens(alpha: float, depth: int) -> float:
    """E[tokens/step] = (1 - α^(K+1)) / (1 - α) for K = depth i.i.d. drafts (arXiv 2211.17192, eq. 1)."""
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
