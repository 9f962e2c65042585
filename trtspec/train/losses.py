"""The losses of Medusa, EAGLE-1 and draft-model training (EAGLE-3's TTT loss: train/eagle3_head.py). Each is a
soft cross-entropy against the target's top-k over the draft vocabulary (positions whose target argmax lies
outside it are masked out), so that every kind learns from the very same teacher rows:

  medusa       head h at t against the teacher at t+1+h, weighted 0.8^h
  eagle        EAGLE-1: smooth-L1(f^_{t+1}, f_{t+1}) + 0.1 soft-CE(L f^_{t+1}), inputs (E[x_{t+1}], f_t + uniform
               noise); L = the target's lm_head rows of the draft vocabulary, frozen
  draft-model  a draft LM's full-vocabulary logits at t against the teacher at t

Each returns (loss, per-part losses, per-part top-1 agreement with the teacher's argmax).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def soft_ce(logq: torch.Tensor, top_ids: torch.Tensor, top_logits: torch.Tensor,
            mask: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Masked mean soft cross-entropy of log-probs logq [B, T, V'] against the teacher's top-k (ids into V'),
    and the top-1 agreement with the teacher's argmax."""
    p = torch.softmax(top_logits.float(), -1)
    ce = -(p * logq.gather(-1, top_ids)).sum(-1)
    m = mask.float()
    denom = m.sum().clamp(min=1.0)
    acc = ((logq.argmax(-1) == top_ids[..., 0]).float() * m).sum() / denom
    return (ce * m).sum() / denom, float(acc)


def medusa_loss(heads, b: dict[str, torch.Tensor], decay: float = 0.8):
    """Head h at position t against the teacher's row at t+1+h (it predicts x_{t+2+h}), weighted decay^h."""
    f, T = b["hidden"], b["hidden"].shape[1]
    total, losses, accs = f.new_zeros(()), [], []
    for h in range(heads.num_heads):
        n = T - 1 - h
        if n <= 0:
            break
        logq = torch.log_softmax(heads.logits(h, f[:, :n]).float(), -1)
        loss, acc = soft_ce(logq, b["top_ids"][:, 1 + h:], b["top_logits"][:, 1 + h:], b["mask"][:, 1 + h:])
        total = total + decay ** h * loss
        losses.append(float(loss.detach()))
        accs.append(acc)
    return total, losses, accs


def eagle1_loss(head, lm: torch.Tensor, embed: torch.Tensor, b: dict[str, torch.Tensor], noise: float,
                gen: torch.Generator, logit_weight: float = 0.1):
    """EAGLE-1: (E[x_{t+1}], f_t + U(-noise, noise)) -> f^_{t+1}; smooth-L1 to f_{t+1} + 0.1 soft-CE of
    lm f^_{t+1} (lm: the target's lm_head rows of the draft vocabulary) against the teacher at t+1."""
    f, ids, m = b["hidden"], b["ids"], b["mask"][:, 1:]
    if f.shape[1] < 2:
        return f.new_zeros((), requires_grad=True), [], []
    x = f[:, :-1] + (torch.rand(f[:, :-1].shape, generator=gen) - 0.5).to(f.device) * 2 * noise
    pred = head(F.embedding(ids[:, 1:], embed), x)
    reg = F.smooth_l1_loss(pred, f[:, 1:], reduction="none").mean(-1)
    reg = (reg * m.float()).sum() / m.float().sum().clamp(min=1.0)
    logq = torch.log_softmax((pred @ lm.T).float(), -1)
    ce, acc = soft_ce(logq, b["top_ids"][:, 1:], b["top_logits"][:, 1:], m)
    return reg + logit_weight * ce, [float(reg.detach()), float(ce.detach())], [acc]


def draft_loss(model, b: dict[str, torch.Tensor], used: torch.Tensor):
    """A draft LM's full-vocabulary logits at t against the teacher's row at t (mapped to target ids)."""
    logits = model(input_ids=b["ids"], use_cache=False).logits
    logq = torch.log_softmax(logits.float(), -1)
    loss, acc = soft_ce(logq, used[b["top_ids"]], b["top_logits"], b["mask"])
    return loss, [float(loss.detach())], [acc]
