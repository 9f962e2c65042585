"""Sampling parameters and processed distributions: what a request samples from, for the target and for a
draft alike (the acceptance rules that compare the two are in rejection.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

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


def sample_token(logits: torch.Tensor, params: SamplingParams, draw: Callable[[int], list[float]]) -> int:
    """One token from logits [V] as `params` say: argmax when greedy, else an inverse-CDF sample of the processed
    distribution with one uniform from `draw` (the request's own generator)."""
    if params.greedy:
        return int(logits.argmax())
    return int(sample(processed_probs(logits, params), draw(1)[0]))
