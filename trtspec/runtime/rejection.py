"""The rejection sampler: which draft tokens a step keeps, and the token after them (vLLM v1's
RejectionSampler). One batched entry point, `rejection_sample`; each rule below is one short function.

The rules are speculative sampling's (Leviathan et al., arXiv 2211.17192; Chen et al., arXiv 2302.01318).
For a draft token x drawn from q where the target's distribution is p (both *processed*: temperature, top-k,
top-p applied; sampling.processed_probs):

    accept x with probability  min(1, p(x) / q(x))                       -> accept_probability
    on rejection, sample from   norm(max(0, p - q))                       -> residual
    if every draft is accepted, sample the bonus token from p

Deterministic candidates (Medusa/EAGLE top-k, n-gram continuations) are drafts whose q is a point mass on x:
the same two rules then read "accept with probability p(x)" and "on rejection, sample from p with x removed".
Several candidate children of one node are tested one after the other against the running residual, which
leaves the emitted token distributed exactly as p (tree verification; a chain is a tree with one child per
node). Greedy decoding is the temperature-0 limit and is implemented as token identity: accept while the
draft equals argmax p, then emit argmax p.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence

import torch

from trtspec.runtime.proposer import Draft
from trtspec.runtime.sampling import SamplingParams, processed_probs, sample


def accept_probability(p_x: torch.Tensor | float, q_x: torch.Tensor | float) -> float:
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
    """Rejection-sampling verification of a draft tree.

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


def rejection_sample(logits: torch.Tensor, drafts: Sequence[Draft], params: Sequence[SamplingParams],
                     draws: Sequence[Callable[[int], list[float]]]) -> tuple[list[list[int]], list[list[int]]]:
    """Verify every row of one step: logits [B, T, V] of the target over [pending token, draft nodes...] per
    row; row b's draft, its SamplingParams and its own uniform draws (`draws[b](n)`, so a request's random
    stream does not depend on its batch). Greedy rows share one batched argmax; sampled rows draw 2n + 2
    uniforms for n inputs (enough for any path). Returns (accepted node path, tokens to emit) per row."""
    argmax = logits.argmax(-1).tolist() if any(sp.greedy for sp in params) else None
    paths, emitted = [], []
    for b, (d, sp) in enumerate(zip(drafts, params)):
        kids = children_of(d.parents)
        n = len(d.tokens) + 1
        if sp.greedy:
            path, nxt = verify_greedy(argmax[b][:n], d.tokens, kids)
        else:
            path, nxt = verify_sampled(processed_probs(logits[b, :n], sp), d.tokens, kids, d.q,
                                       iter(draws[b](2 * n + 2)))
        paths.append(path)
        emitted.append([d.tokens[j] for j in path] + [nxt])
    return paths, emitted
