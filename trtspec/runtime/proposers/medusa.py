"""medusa: heads on the target's last hidden state propose a chain of top-1s, or the tree in `choices`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trtspec.artifacts.heads import load_medusa
from trtspec.errors import ModelError
from trtspec.runtime.llama import Linear, Llama, draft_dtype
from trtspec.runtime.proposer import EMPTY, Draft, DraftPlan, HeadProposer, ProposalBatch


class MedusaProposer(HeadProposer):
    """Medusa heads: x = f + silu(W_h f + b_h) (per residual layer), logits_h = L_h x, on the target's final
    hidden state f_t; head h predicts token t+2+h. Candidates: path [i, j, ..] = top-i of head 0, top-j of
    head 1, ...; without `choices` a chain of the K heads' top-1. They are deterministic: verified as point
    masses. State per row: the last hidden state."""

    name = "medusa"

    def setup(self, target: Llama, max_batch: int, max_seq: int, k: int) -> DraftPlan:
        mc, w = load_medusa(self.path, target.cfg)  # fits the target, every tensor of the layout present
        nh, nl = mc.num_heads, mc.num_layers
        H, V = target.cfg.hidden_size, target.cfg.vocab_size
        dt = self.weight_dtype or draft_dtype(target.dtype, self.device, 4 * nh * (nl * H * H + V * H))

        def get(key: str) -> torch.Tensor:
            if key not in w:
                raise ModelError(f"medusa heads: missing tensor {key!r}")
            return w[key].to(device=self.device, dtype=dt)

        # layer 0 of all heads reads the same f: one fused linear; later layers and the LM heads per head
        self.first = Linear(torch.cat([get(f"{h}.0.linear.weight") for h in range(nh)]),
                            torch.cat([get(f"{h}.0.linear.bias") for h in range(nh)]), single_row=True)
        self.rest = [[Linear(get(f"{h}.{layer}.linear.weight"), get(f"{h}.{layer}.linear.bias"), single_row=True)
                      for h in range(nh)] for layer in range(1, nl)]
        self.heads = [Linear(get(f"{h}.{nl}.weight"), single_row=True) for h in range(nh)]
        if tuple(self.heads[0].w.shape) != (V, H):
            raise ModelError(f"medusa heads: lm head shape {tuple(self.heads[0].w.shape)} != (vocab {V}, hidden {H})")
        self.num_heads = nh
        if self.tree and max(d for _, _, d in self.tree) > nh:
            raise ModelError(f"medusa: the choices tree is deeper than the {nh} heads")
        self.last = torch.zeros(max_batch, H, device=self.device, dtype=target.dtype)
        return self.plan(k, max_depth=nh)

    def admit(self, row: int, hidden: torch.Tensor) -> None:
        self.last[row] = hidden[-1]

    def move_row(self, src: int, dst: int) -> None:
        self.last[dst] = self.last[src]

    def head_logits(self, f: torch.Tensor, heads: int) -> torch.Tensor:
        """f [B, H] -> logits [heads, B, V] of the first `heads` heads."""
        B, H = f.shape
        x = (f[:, None, :] + F.silu(self.first(f).view(B, self.num_heads, H)))[:, :heads]
        for layer in self.rest:
            x = torch.stack([x[:, h] + F.silu(layer[h](x[:, h])) for h in range(heads)], 1)
        return torch.stack([self.heads[h](x[:, h]) for h in range(heads)])

    def propose(self, batch: ProposalBatch) -> list[Draft]:
        ks = batch.ks
        K, B = max(ks), len(batch)
        if K == 0:
            return [EMPTY] * B
        nodes = self.tree[:K] if self.tree else [(i - 1, 0, i + 1) for i in range(K)]
        heads = max(d for _, _, d in nodes)
        top = self.head_logits(self.last[:B], heads).topk(max(r for _, r, _ in nodes) + 1, dim=-1).indices
        top = top.tolist()  # [head][row][rank]
        drafts = []
        for b, k in enumerate(ks):
            mine = nodes[:k]
            drafts.append(Draft([top[d - 1][b][r] for _, r, d in mine], tuple(p for p, _, _ in mine))
                          if k else EMPTY)
        return drafts

    def commit(self, paths: list[list[int]], hidden: torch.Tensor) -> None:
        for b, path in enumerate(paths):
            self.last[b] = hidden[b, path[-1] + 1 if path else 0]
