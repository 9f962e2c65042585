"""eagle: a one-layer feature-level head (EAGLE-1) run autoregressively proposes a chain, or the tree in `choices`.

    weights        speculative.heads: a one-layer Llama config + model.safetensors (fc + the layer;
                   artifacts/heads.py); an EAGLE-3 head (eagle_version 3) runs through methods/eagle3.py
    torch          EagleProposer (deterministic candidates: verified as point masses); Eagle3Proposer for
                   EAGLE-3 heads (reduced vocabulary, sampled chains carry q)
    runtimes       what the TensorRT-LLM runtimes make of it is their method tables' (docs/architecture.md)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.artifacts import heads as layouts
from trtspec.artifacts.fs import read_json_object
from trtspec.artifacts.hf import CONFIG, summary
from trtspec.artifacts.pair import llama_weight_problems
from trtspec.errors import TrtspecError
from trtspec.methods.base import Method
from trtspec.runtime.proposer import EMPTY, Draft, DraftPlan, HeadProposer, ProposalBatch, Proposer, chain
from trtspec.spec import Problem, Spec

if TYPE_CHECKING:
    import torch

    from trtspec.artifacts.hf import ModelConfig
    from trtspec.runtime.cache import StepInputs
    from trtspec.runtime.llama import Llama

NAME = "eagle"
class EagleProposer(HeadProposer):
    """EAGLE: at position t, x_t = fc([embed(token_{t+1}), f_t]) runs through one decoder layer (no input norm,
    causal, RoPE) to f^_{t+1}; target.lm_head(f^_{t+1}) predicts token_{t+2}. f_t are the target's final hidden
    states while they are known, then the head's own outputs. The head's cache holds only entries built from
    the target's real features; entries fed during drafting are dropped (the length never covers them).
    Candidates are the head's top-i (deterministic: verified as point masses). State per row: the head's KV
    cache and the target features not yet fed to it."""

    name = NAME

    def setup(self, target: Llama, max_batch: int, max_seq: int, k: int) -> DraftPlan:
        from trtspec.runtime.llama import Linear, Llama, draft_dtype

        t = target.cfg
        cfg, w = layouts.load_eagle(self.path, t)  # fits the target; tensors without a "model." prefix
        layer = (dataclasses.replace(cfg, num_layers=1, tie_word_embeddings=True).num_params
                 - t.vocab_size * t.hidden_size)
        head = 2 * t.hidden_size * t.hidden_size + t.vocab_size * t.hidden_size  # fc + the LM head copy
        dt, wdt = target.dtype, self.weight_dtype or draft_dtype(target.dtype, self.device, 4 * (layer + head))
        self.fc = Linear(w["fc.weight"].to(device=self.device, dtype=dt),
                         w["fc.bias"].to(device=self.device, dtype=dt) if "fc.bias" in w else None, dtype=wdt)
        cfg = dataclasses.replace(cfg, num_layers=1, rope_theta=t.rope_theta, rope_scaling=t.rope_scaling,
                                  max_position_embeddings=t.max_position_embeddings)
        self.net = Llama(cfg, w, dtype=dt, device=self.device, max_seq=max_seq, name=NAME, prefix="",
                         input_norm=False, final_norm=False, embed=target.embed, lm_head=target.head_weight(),
                         weight_dtype=wdt)
        self.net.use_onednn_single_row(True)  # runs between target passes: its weights come from memory
        self.fc.min_rows = 1
        self.cache = self.net.new_cache(max_batch, max_seq)
        self.pending: list[list[torch.Tensor]] = [[] for _ in range(max_batch)]
        return self.plan(k)

    def admit(self, row: int, hidden: torch.Tensor) -> None:
        self.cache.lengths[row] = 0
        self.pending[row] = [hidden]

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)
        self.pending[dst], self.pending[src] = self.pending[src], []

    def commit(self, paths: list[list[int]], hidden: torch.Tensor) -> None:
        for b, path in enumerate(paths):
            self.pending[b].append(hidden[b, [0] + [j + 1 for j in path]])

    def _run(self, tokens: torch.Tensor, feats: torch.Tensor, inp: StepInputs, last=None):
        """One head pass: (logits at `last` or all, new features [B, T, H])."""
        import torch

        x = self.fc(torch.cat([self.net.embed_tokens(tokens), feats], -1))
        h = self.net.hidden(x, self.cache, inp.positions, inp.start, inp.mask)
        hs = h if last is None else h.gather(1, last[..., None].expand(-1, -1, h.shape[-1]))
        return self.net.logits(hs), h

    def _sync(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed every row's not-yet-fed positions (real target features); return the last logits/features."""
        import torch
        import torch.nn.functional as F

        from trtspec.runtime.cache import chain_inputs

        B = len(seqs)
        lengths = self.cache.lengths[:B]
        feats = [torch.cat(self.pending[b]) if len(self.pending[b]) != 1 else self.pending[b][0] for b in range(B)]
        n = [f.shape[0] for f in feats]
        T = max(n)
        toks = [s[m + 1:m + 1 + k] for s, m, k in zip(seqs, lengths, n)]
        tokens = torch.tensor([t + [0] * (T - len(t)) for t in toks], device=self.device)
        fpad = torch.stack([F.pad(f, (0, 0, 0, T - f.shape[0])) for f in feats]) if B > 1 else feats[0][None]
        last = torch.tensor([[k - 1] for k in n], device=self.device)
        lg, h = self._run(tokens, fpad, chain_inputs(lengths, T, self.device), last)
        for b in range(B):
            self.cache.lengths[b] += n[b]
            self.pending[b] = []
        return lg[:, 0], h.gather(1, last[..., None].expand(-1, -1, h.shape[-1]))[:, 0]

    def propose(self, batch: ProposalBatch) -> list[Draft]:
        import torch

        from trtspec.runtime.cache import chain_inputs

        ks = batch.ks
        K = max(ks)
        if K == 0:
            return [EMPTY] * len(batch)
        logits, feat = self._sync(batch.seqs)
        base = self.cache.lengths[:len(batch)]
        if self.tree is None:
            toks = [logits.argmax(-1)]
            for d in range(1, K):
                inp = chain_inputs([m + d - 1 for m in base], 1, self.device)
                lg, h = self._run(toks[-1][:, None], feat[:, None], inp)
                toks.append(lg[:, 0].argmax(-1))
                feat = h[:, 0]
            t = torch.stack(toks, 1).tolist()
            return [Draft(t[b][:k], chain(k)) if k else EMPTY for b, k in enumerate(ks)]
        return self._propose_tree(ks, logits, feat, base)

    def _propose_tree(self, ks, logits, feat, base) -> list[Draft]:
        """Tree drafting, one head pass per depth over every node that has children."""
        import torch

        from trtspec.runtime.cache import StepInputs

        B = len(ks)
        nodes = [self.tree[:k] for k in ks]
        kids = [[[] for _ in ns] for ns in nodes]
        for b, ns in enumerate(nodes):
            for j, (p, _, _) in enumerate(ns):
                if p >= 0:
                    kids[b][p].append(j)
        tokens = [[0] * len(ns) for ns in nodes]
        ranks = max((r for ns in nodes for _, r, _ in ns), default=0) + 1
        top = logits.topk(ranks, dim=-1).indices.tolist()
        for b, ns in enumerate(nodes):
            for j, (p, r, _) in enumerate(ns):
                if p < 0:
                    tokens[b][j] = top[b][r]
        slot = [dict() for _ in range(B)]  # node -> cache slot of its head entry
        feat_of = [dict() for _ in range(B)]  # node -> head output feature
        nxt = list(base)
        depth = max((d for ns in nodes for _, _, d in ns), default=0)
        for d in range(1, depth):
            feed = [[j for j, (_, _, dj) in enumerate(ns) if dj == d and kids[b][j]] for b, ns in enumerate(nodes)]
            T = max(len(f) for f in feed)
            if T == 0:
                break
            tok = torch.zeros(B, T, dtype=torch.long, device=self.device)
            fin = torch.zeros(B, T, feat.shape[-1], dtype=feat.dtype, device=self.device)
            S = max(nxt) + T
            mask = (torch.arange(S, device=self.device)[None, None, :]
                    < torch.tensor(base, device=self.device)[:, None, None])
            mask = mask.expand(B, T, S).clone()
            pos = torch.zeros(B, T, dtype=torch.long, device=self.device)
            for b, js in enumerate(feed):
                for i in range(T):
                    mask[b, i, nxt[b] + i] = True
                    pos[b, i] = base[b] + d - 1
                for i, j in enumerate(js):
                    slot[b][j] = nxt[b] + i
                    tok[b, i] = tokens[b][j]
                    p = nodes[b][j][0]
                    fin[b, i] = feat[b] if p < 0 else feat_of[b][p]
                    a = p
                    while a >= 0:
                        mask[b, i, slot[b][a]] = True
                        a = nodes[b][a][0]
            lg, h = self._run(tok, fin, StepInputs(pos, list(nxt), mask[:, None]))
            want = max((nodes[b][c][1] for b, js in enumerate(feed) for j in js for c in kids[b][j]), default=0) + 1
            top = lg.topk(want, dim=-1).indices.tolist()
            for b, js in enumerate(feed):
                for i, j in enumerate(js):
                    feat_of[b][j] = h[b, i]
                    for c in kids[b][j]:
                        tokens[b][c] = top[b][i][nodes[b][c][1]]
                nxt[b] += T
        return [Draft(tokens[b], tuple(p for p, _, _ in ns)) if ns else EMPTY for b, ns in enumerate(nodes)]


def _version3(heads: str | Path) -> bool:
    """An EAGLE-3 head (one that cannot be read is judged by the EAGLE-1 path, which reports why)."""
    try:
        return (Path(heads) / CONFIG).is_file() and layouts.eagle_version(Path(heads)) == 3
    except TrtspecError:
        return False


class Eagle(Method):
    name = NAME
    title = "EAGLE"
    weights = "heads"
    tree = True

    def drafter(self, spec: Spec) -> dict[str, Any] | None:
        heads = spec.speculative.heads
        return None if heads is None else summary(read_json_object(Path(heads) / CONFIG, "EAGLE head"))

    def pair_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]:
        """The head's attention and sizes are the target's (what the runtime and the converter compare)."""
        heads = spec.speculative.heads
        if heads is None:
            return []
        if _version3(heads):
            from trtspec.methods import eagle3

            return eagle3.pair_problems(Path(heads), target, Path(spec.tokenizer_dir))
        return [Problem("speculative.heads", str(heads), d, "use heads trained on this target")
                for d in layouts.eagle_config(heads, target).differences(target, layouts.EAGLE_FIT)]

    def weight_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]:
        heads = spec.speculative.heads
        if heads is None or not (Path(heads) / CONFIG).is_file():
            return []
        if _version3(heads):
            from trtspec.methods import eagle3

            return eagle3.weight_problems(Path(heads), target)
        return llama_weight_problems("speculative.heads", Path(heads), layouts.eagle_config(heads, target), head=True)

    def proposer(self, spec: Spec, device: str) -> Proposer:
        if _version3(spec.speculative.heads):
            from trtspec.methods.eagle3 import Eagle3Proposer

            return Eagle3Proposer(spec.speculative.heads, spec.speculative.choices, device=device)
        return EagleProposer(spec.speculative.heads, spec.speculative.choices, device=device)
