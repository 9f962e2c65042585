"""Processed distributions (temperature, top-k, top-p, greedy) and the inverse-CDF sampler; the acceptance
rules are tested in test_rejection.py."""

from __future__ import annotations

import torch

from trtspec.runtime import sampling as S
from trtspec.runtime.sampling import SamplingParams, processed_probs

# ------------------------------------------------------------------------------------------ processed probs

def test_processed_probs_temperature_topk_topp_greedy():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0, 0.2, 1.5]])
    p = processed_probs(logits, SamplingParams(temperature=0.7))
    assert torch.allclose(p, torch.softmax(logits / 0.7, -1))
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_k=3))
    keep = torch.tensor([0, 7, 1])
    want = torch.zeros(1, 8)
    want[0, keep] = torch.softmax(logits[0, keep], -1)
    assert torch.allclose(p, want)
    full = torch.softmax(logits, -1)[0]
    p = processed_probs(logits, SamplingParams(temperature=1.0, top_p=0.6))
    order = full.argsort(descending=True)
    need = int((full[order].cumsum(0) < 0.6).sum()) + 1  # smallest prefix with mass >= 0.6
    assert set(p[0].nonzero().flatten().tolist()) == set(order[:need].tolist())
    assert torch.allclose(p.sum(), torch.tensor(1.0))
    g = processed_probs(logits, SamplingParams(temperature=0.0))
    assert g[0].tolist() == [1.0] + [0.0] * 7


def test_inverse_cdf_sample_never_picks_zero_probability():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5, 0.0])
    for u in (0.0, 0.25, 0.4999, 0.5, 0.75, 0.999999):
        assert int(S.sample(probs, u)) in (1, 3)
    assert int(S.sample(torch.tensor([0.0, 0.0, 1.0]), 0.0)) == 2
