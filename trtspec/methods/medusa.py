"""medusa: heads on the target's last hidden state propose a chain of top-1s, or the tree in `choices`.

    weights        speculative.heads: config.json (medusa_num_heads, ...) + medusa_lm_head.safetensors
                   (artifacts/heads.py: the layout, its one reader of medusa_num_heads)
    torch          MedusaProposer (deterministic candidates: verified as point masses)
    runtimes       what the TensorRT-LLM runtimes make of it is their method tables' (docs/architecture.md)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.artifacts import heads as layouts
from trtspec.artifacts.fs import read_json_object
from trtspec.artifacts.hf import CONFIG, summary
from trtspec.artifacts.pair import medusa_weight_problems
from trtspec.errors import ModelError
from trtspec.methods.base import Method
from trtspec.runtime.proposer import EMPTY, Draft, DraftPlan, HeadProposer, ProposalBatch, Proposer
from trtspec.spec import Problem, Spec

if TYPE_CHECKING:
    import torch

    from trtspec.artifacts.hf import ModelConfig
    from trtspec.runtime.llama import Llama

NAME = "medusa"


class MedusaProposer(HeadProposer):
    """Medusa heads: x = f + silu(W_h f + b_h) (per residual layer), logits_h = L_h x, on the target's final
    hidden state f_t; head h predicts token t+2+h. Candidates: path [i, j, ..] = top-i of head 0, top-j of
    head 1, ...; without `choices` a chain of the K heads' top-1. They are deterministic: verified as point
    masses. State per row: the last hidden state."""

    name = NAME

    def setup(self, target: Llama, max_batch: int, max_seq: int, k: int) -> DraftPlan:
        import torch

        from trtspec.runtime.llama import Linear, draft_dtype

        mc, w = layouts.load_medusa(self.path, target.cfg)  # fits the target, every tensor of the layout present
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
        import torch
        import torch.nn.functional as F

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


def heads_depth_problems(spec: Spec, heads: int) -> list[Problem]:
    """A tree deeper than the heads, or a chain longer than them (needs the heads' config)."""
    choices = spec.speculative.choices or []
    deepest = max((len(c) for c in choices), default=0)
    if deepest > heads:
        return [Problem("speculative.choices", f"depth {deepest}",
                        f"deeper than the number of Medusa heads ({heads})",
                        f"keep every path at most {heads} long")]
    if spec.speculative.num_draft_tokens > heads and not choices:
        return [Problem("speculative.num_draft_tokens", spec.speculative.num_draft_tokens,
                        f"a Medusa chain cannot be longer than the number of heads ({heads})",
                        f"set num_draft_tokens <= {heads} or give a tree in speculative.choices")]
    return []


class Medusa(Method):
    name = NAME
    title = "Medusa"
    weights = "heads"
    tree = True

    def drafter(self, spec: Spec) -> dict[str, Any] | None:
        heads = spec.speculative.heads
        return None if heads is None else summary(read_json_object(Path(heads) / CONFIG, "Medusa heads"))

    def pair_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]:
        """Heads of the target's hidden and vocab size, a tree they can draft, their weights file there."""
        heads, p = spec.speculative.heads, []
        if heads is None:
            return p
        try:
            mcfg = layouts.medusa_config(heads)
        except ModelError as exc:
            p.append(Problem("speculative.heads", str(heads), exc.message, exc.hint or ""))
        else:
            p += [Problem("speculative.heads", str(heads), d, "use heads trained on this target")
                  for d in mcfg.differences(target)]
            p += heads_depth_problems(spec, mcfg.num_heads)
        if not (Path(heads) / layouts.MEDUSA_WEIGHTS).is_file():
            p.append(Problem("speculative.heads", str(heads), f"no {layouts.MEDUSA_WEIGHTS}",
                             f"export the heads as {layouts.MEDUSA_WEIGHTS}"))
        return p

    def weight_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]:
        heads = spec.speculative.heads
        if heads is None or not (Path(heads) / CONFIG).is_file():
            return []
        return medusa_weight_problems("speculative.heads", Path(heads), target)

    def proposer(self, spec: Spec, device: str) -> Proposer:
        return MedusaProposer(spec.speculative.heads, spec.speculative.choices, device=device)
