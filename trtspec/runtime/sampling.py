"""Sampling parameters, processed distributions and the acceptance rules of speculative decoding.

The rules follow reference/speculative-decoding.md. For a draft token x drawn from q where the target's
distribution is p (both *processed*: temperature, top-k, top-p applied):

    accept x with probability  min(1, p(x) / q(x))                       -> accept_probability
    on rejection, sample from   norm(max(0, p - q))                       -> residual
    if every draft is accepted, sample the bonus token from p

Deterministic candidates (Medusa/EAGLE top-k, n-gram continuations) are drafts whose q is a point mass on x:
the same two rules then read "accept with probability p(x)" and "on rejection, sample from p with x removed".
Several candidate children of one node are tested one after the other against the running residual, which
leaves the emitted token distributed exactly as p (tree verification). Greedy decoding is the temperature-0
limit and is implemented as token identity: accept while the draft equals argmax p, then emit argmax p.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterator

import torch


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding settings.

    temperature 0 (or top_k 1) is greedy. seed: per-request generator (None: nondeterministic).
    stop: strings that end generation (trimmed from the text). end_id: EOS token (None: the model's EOS,
    -1: none). num_draft_tokens: None = the spec's K with adaptive control, 0 = no speculation,
    n = a fixed K of n.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    end_id: int | None = None
    num_draft_tokens: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a request samples from: softmax(logits / T) restricted to top-k and then top-p.

    logits [..., V] -> probs [..., V] (float32). Greedy requests get a one-hot at argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    V = logits.shape[-1]
    if 0 < params.top_k < V:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p
        sorted_p = sorted_p.masked_fill(mass_before >= params.top_p, 0.0)  # smallest set with mass >= top_p
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, u: float | torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sample from probs [..., V] with uniform(s) u in [0, 1) (never picks a zero-probability token)."""
    cdf = probs.cumsum(-1)
    u = torch.as_tensor(u, dtype=cdf.dtype, device=cdf.device)
    return torch.searchsorted(cdf, (u * cdf[..., -1]).unsqueeze(-1), right=True).squeeze(-1).clamp(
        max=probs.shape[-1] - 1)


# ------------------------------------------------------------------------------------------- acceptance rules

def accept_probability(p_x: torch.Tensor | float, q_x: torch.Tensor | float) -> torch.Tensor | float:
    """min(1, p(x) / q(x))."""
    p_x, q_x = float(p_x), float(q_x)
    return min(1.0, p_x / q_x) if q_x > 0 else float(p_x > 0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where to sample after rejecting a draft from q (p itself if nothing is left)."""
    r = (p - q).clamp(min=0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp(min=1e-30), p)


def point_mass(x: int, like: torch.Tensor) -> torch.Tensor:
    """q of a deterministic candidate x."""
    return torch.zeros_like(like).index_fill_(-1, torch.tensor([x], device=like.device), 1.0)


def verify_greedy(target_argmax: list[int], tokens: list[int], children: list[list[int]]) -> tuple[list[int], int]:
    """Greedy verification of a draft tree: walk down while a child equals the target's argmax.

    target_argmax[i]: argmax of the target at input i (input 0 = the last committed token, input 1+j = draft
    node j). children[i]: draft nodes under input i. Returns (accepted node path, the token emitted after it).
    """
    at, path = 0, []
    while True:
        want = target_argmax[at]
        for j in children[at]:
            if tokens[j] == want:
                path.append(j)
                at = j + 1
                break
        else:
            return path, want


def verify_sampled(p: torch.Tensor, tokens: list[int], children: list[list[int]], q: torch.Tensor | None,
                   u: Iterator[float]) -> tuple[list[int], int]:
    """Rejection-sampling verification of a draft tree (a chain is a tree with one child per node).

    p [inputs, V]: the target's processed distributions; q [nodes, V]: the draft's, or None for deterministic
    candidates (point masses). u: uniform draws. At each input, children are tested in order against the
    running distribution (accept_probability), which becomes the residual after each rejection; the first
    accepted child is descended into. When none is accepted (or there are none) the token is sampled from the
    running distribution: the residual after a rejection, p itself at a leaf (the bonus token).
    """
    at, path = 0, []
    while True:
        dist = p[at]
        for j in children[at]:
            x = tokens[j]
            qj = q[j] if q is not None else point_mass(x, dist)
            if next(u) < accept_probability(dist[x], qj[x]):
                path.append(j)
                at = j + 1
                break
            dist = residual(dist, qj)
        else:
            return path, int(sample(dist, next(u)))


@functools.lru_cache(maxsize=1024)
def children_of(parents: tuple[int, ...]) -> list[list[int]]:
    """Children per verify input: input 0 is the root (parent -1), input 1+j is draft node j (cached: do not
    modify the result)."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for j, par in enumerate(parents):
        kids[par + 1].append(j)
    return kids
