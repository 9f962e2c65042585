"""Drafters: what proposes the tokens the target verifies. One interface, five methods.

Every step the engine asks `propose(rows, ks)` for a `Draft` per row (at most ks[b] tokens deep; also when
every ks[b] is 0), verifies all rows in one target pass, then calls `commit(rows, paths, hidden)` with the
accepted node path of each row and the target's final hidden states of the verify pass (before the new tokens
join the rows' sequences). `commit` uses only what this step's `propose` recorded: rows move between steps
(`move_row`), so per-step state must never outlive its step. A row is a
request: `row.seq` (prompt + generated; the last token is *pending*: emitted but not yet run through the
target), `row.params` (SamplingParams) and `row.uniforms(n)` (the request's own random draws).

| method      | proposes                                                     | state kept per row            |
|-------------|--------------------------------------------------------------|-------------------------------|
| none        | nothing (plain decoding)                                     | -                             |
| draft-model | a chain sampled from a small LM's processed distribution q   | its KV cache (rolled back)    |
| medusa      | top-i candidates of heads on the target's last hidden state; | the last hidden state         |
|             | a chain of top-1s, or the tree in `choices`                  |                               |
| eagle       | top-i candidates of a one-layer feature-level head run       | its KV cache + target features|
|             | autoregressively; a chain, or the tree in `choices`          | not yet fed                   |
| lookahead   | prompt-lookup n-grams: continuations of the latest matches   | an n-gram index of the row    |
|             | of the sequence's last n tokens, up to G of them as a trie   |                               |

Medusa, EAGLE and n-gram candidates are deterministic, so they are verified as point-mass drafts (see
sampling.py): exact for greedy and for sampling. The draft model's samples carry their q.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol, Sequence

import torch
import torch.nn.functional as F

from trtspec.errors import ModelError
from trtspec.runtime.cache import StepInputs, chain_inputs
from trtspec.runtime.llama import Linear, Llama, LlamaConfig, draft_dtype, load_safetensors, read_json
from trtspec.runtime.sampling import SamplingParams, processed_probs, sample


class Row(Protocol):
    seq: list[int]
    params: SamplingParams

    def uniforms(self, n: int) -> list[float]: ...


@dataclasses.dataclass
class Draft:
    tokens: list[int]
    parents: tuple[int, ...]  # parent node of each node; -1: the pending token (root)
    q: torch.Tensor | None = None  # [nodes, V] draft distributions; None: deterministic candidates

    @property
    def depths(self) -> list[int]:
        d: list[int] = []
        for p in self.parents:
            d.append(1 if p < 0 else d[p] + 1)
        return d

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    def pruned(self, max_depth: int) -> "Draft":
        """The nodes at most max_depth deep (parents come before children, so the tree stays whole)."""
        keep = [j for j, d in enumerate(self.depths) if d <= max_depth]
        if len(keep) == len(self.tokens):
            return self
        new = {j: i for i, j in enumerate(keep)}
        return Draft([self.tokens[j] for j in keep], tuple(new.get(self.parents[j], -1) for j in keep),
                     None if self.q is None else self.q[keep])


EMPTY = Draft([], ())


def chain(n: int) -> tuple[int, ...]:
    return tuple(range(-1, n - 1))


def tree_from_choices(choices: Sequence[Sequence[int]]) -> list[tuple[int, int, int]]:
    """(parent node, top-i rank, depth) per node of a `choices` tree (every prefix listed before its path)."""
    index = {(): -1}
    nodes = []
    for path in choices:
        path = tuple(path)
        index[path] = len(nodes)
        nodes.append((index[path[:-1]], path[-1], len(path)))
    return nodes


def tree_options(tree: list[tuple[int, int, int]], k_max: int) -> list[tuple[int, int]]:
    """(first n nodes, their depth) for n = 1..k_max: the sub-trees a node budget gives."""
    out, depth = [], 0
    for n, (_, _, d) in enumerate(tree[:k_max], start=1):
        depth = max(depth, d)
        out.append((n, depth))
    return out


class Drafter:
    """No drafting: plain decoding through the same engine."""

    name = "none"
    k_counts_nodes = False  # True: K is a tree's node budget (its depth is capped separately), else a depth

    def setup(self, target: Llama, max_batch: int, max_seq: int) -> None:
        self.target = target

    def max_draft_tokens(self, k: int) -> int:
        """The largest K this drafter can honour given the spec's K."""
        return 0

    def max_nodes(self, k: int) -> int:
        """Upper bound on the draft nodes of one step when drafting up to k tokens."""
        return k

    def k_options(self, k_max: int) -> list[tuple[int, int]]:
        """(K, depth of the draft it gives) for K = 1..k_max: what adaptive K chooses from."""
        return [(k, k) for k in range(1, k_max + 1)]

    def admit(self, row: int, req: Row, hidden: torch.Tensor) -> None:
        """A request entered `row`; hidden [P, H]: the target's final hidden states over its prompt."""

    def propose(self, rows: list[Row], ks: list[int]) -> list[Draft]:
        return [EMPTY] * len(rows)

    def commit(self, rows: list[Row], paths: list[list[int]], hidden: torch.Tensor) -> None:
        """After verification: paths[b] = accepted draft nodes; hidden [B, T, H] of the verify inputs."""

    def move_row(self, src: int, dst: int) -> None:
        """Row `src` now lives at row `dst` (the engine keeps active rows dense)."""


# ----------------------------------------------------------------------------------------------- draft model

class DraftModelDrafter(Drafter):
    """An independent small LM with its own KV cache, kept in sync with what the target accepted.

    The draft cache holds a prefix of the row's sequence; each propose first feeds what it has not seen
    (the pending token, plus the last accepted draft when all were accepted) and then samples K tokens, feeding
    each of the first K-1 back. Afterwards its length is set to the part of what it fed that was accepted.
    """

    name = "draft-model"

    def __init__(self, path: str | Path, dtype: str = "float32", device: str = "cpu", weight_dtype: torch.dtype | None = None):
        self.path, self.dtype, self.device, self.weight_dtype = Path(path), dtype, device, weight_dtype

    def setup(self, target: Llama, max_batch: int, max_seq: int) -> None:
        super().setup(target, max_batch, max_seq)
        wdt = self.weight_dtype or draft_dtype(self.dtype, self.device, 4 * LlamaConfig.from_dir(self.path).num_params)
        self.model = Llama.from_dir(self.path, dtype=self.dtype, device=self.device, max_seq=max_seq, name="draft",
                                    weight_dtype=wdt)
        self.cache = self.model.new_cache(max_batch, max_seq)
        self.vocab = target.cfg.vocab_size
        self._fed: list[int] = []

    def max_draft_tokens(self, k: int) -> int:
        return k

    def admit(self, row: int, req: Row, hidden: torch.Tensor) -> None:
        self.cache.lengths[row] = 0

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)

    def _logits(self, lg: torch.Tensor) -> torch.Tensor:
        """The draft's logits over the target's vocabulary (a larger draft vocab is cut, a smaller one padded)."""
        V = lg.shape[-1]
        if V > self.vocab:
            return lg[..., : self.vocab]
        if V < self.vocab:
            return F.pad(lg, (0, self.vocab - V), value=float("-inf"))
        return lg

    def propose(self, rows: list[Row], ks: list[int]) -> list[Draft]:
        K, B = max(ks), len(rows)
        if K == 0:
            self._fed = []
            return [EMPTY] * B
        lengths = self.cache.lengths[:B]
        feeds = [r.seq[n:] for r, n in zip(rows, lengths)]
        T = max(len(f) for f in feeds)
        tokens = torch.tensor([f + [0] * (T - len(f)) for f in feeds], device=self.device)
        inp = chain_inputs(lengths, T, self.device)
        last = torch.tensor([[len(f) - 1] for f in feeds], device=self.device)
        lg, _ = self.model.forward(self.cache, inp.positions, inp.start, inp.mask, tokens=tokens, logits_at=last)
        greedy = all(r.params.greedy for r in rows)
        # each sampling row draws exactly its own k uniforms: its random stream does not depend on the batch
        u = None if greedy else torch.tensor([(r.uniforms(k) if not r.params.greedy else [0.0] * k) + [0.0] * (K - k)
                                              for r, k in zip(rows, ks)])
        n = [len(r.seq) for r in rows]
        drafted, qs = [], []
        for i in range(K):
            lg = self._logits(lg[:, -1])
            if greedy:
                x = lg.argmax(-1)
            else:
                q = torch.stack([processed_probs(lg[b], r.params) for b, r in enumerate(rows)])
                x = sample(q, u[:, i])
                qs.append(q)
            drafted.append(x)
            if i < K - 1:
                inp = chain_inputs([m + i for m in n], 1, self.device)
                lg, _ = self.model.forward(self.cache, inp.positions, inp.start, inp.mask, tokens=x[:, None])
        self._fed = [(m, m + K - 1) for m in n]  # (sequence length before the step, what the cache holds)
        toks = torch.stack(drafted, 1).tolist()
        q_all = torch.stack(qs, 1) if qs else None
        return [Draft(toks[b][:k], chain(k), None if q_all is None or rows[b].params.greedy else q_all[b, :k])
                if k else EMPTY for b, k in enumerate(ks)]

    def commit(self, rows: list[Row], paths: list[list[int]], hidden: torch.Tensor) -> None:
        fed, self._fed = self._fed, []  # this step's only: after a move_row it would describe another request
        for b, ((before, n), path) in enumerate(zip(fed, paths)):
            # keep what was fed up to the first fed token that is not in the sequence: before + accepted drafts
            self.cache.lengths[b] = min(n, before + len(path))


# ---------------------------------------------------------------------------------------------------- medusa

class _HeadDrafter(Drafter):
    """A drafter whose weights (a heads dir) ride on the target: Medusa and EAGLE, chain or tree."""

    def __init__(self, path: str | Path, choices: list[list[int]] | None = None, device: str = "cpu",
                 weight_dtype: torch.dtype | None = None):
        self.path, self.choices, self.device, self.weight_dtype = Path(path), choices, device, weight_dtype
        self.tree = None  # set by setup() from `choices`: a tree, or None for a chain

    @property
    def k_counts_nodes(self) -> bool:
        return self.tree is not None

    def k_options(self, k_max: int) -> list[tuple[int, int]]:
        return tree_options(self.tree, k_max) if self.tree else super().k_options(k_max)


class MedusaDrafter(_HeadDrafter):
    """Medusa heads: x = f + silu(W_h f + b_h) (per residual layer), logits_h = L_h x, on the target's final
    hidden state f_t; head h predicts token t+2+h. Candidates: path [i, j, ..] = top-i of head 0, top-j of
    head 1, ...; without `choices` a chain of the K heads' top-1."""

    name = "medusa"

    def setup(self, target: Llama, max_batch: int, max_seq: int) -> None:
        super().setup(target, max_batch, max_seq)
        cfg = read_json(self.path / "config.json")
        try:
            nh, nl = int(cfg["medusa_num_heads"]), int(cfg.get("medusa_num_layers", 1))
        except KeyError:
            raise ModelError(f"{self.path / 'config.json'}: no medusa_num_heads",
                             hint="a Medusa heads dir has config.json with medusa_num_heads") from None
        H, V = target.cfg.hidden_size, target.cfg.vocab_size
        for key, want in (("hidden_size", H), ("vocab_size", V)):
            if key in cfg and int(cfg[key]) != want:
                raise ModelError(f"medusa heads: {key} {cfg[key]} != the target's {want}")
        w = load_safetensors(self.path, "medusa_lm_head.safetensors")
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
        self.tree = tree_from_choices(self.choices) if self.choices else None
        if self.tree and max(d for _, _, d in self.tree) > nh:
            raise ModelError(f"medusa: the choices tree is deeper than the {nh} heads")
        self.last = torch.zeros(max_batch, H, device=self.device, dtype=target.dtype)

    def max_draft_tokens(self, k: int) -> int:
        return min(k, len(self.tree)) if self.tree else min(k, self.num_heads)

    def admit(self, row: int, req: Row, hidden: torch.Tensor) -> None:
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

    def propose(self, rows: list[Row], ks: list[int]) -> list[Draft]:
        K, B = max(ks), len(rows)
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

    def commit(self, rows: list[Row], paths: list[list[int]], hidden: torch.Tensor) -> None:
        for b, path in enumerate(paths):
            self.last[b] = hidden[b, path[-1] + 1 if path else 0]


# ----------------------------------------------------------------------------------------------------- eagle

class EagleDrafter(_HeadDrafter):
    """EAGLE: at position t, x_t = fc([embed(token_{t+1}), f_t]) runs through one decoder layer (no input norm,
    causal, RoPE) to f^_{t+1}; target.lm_head(f^_{t+1}) predicts token_{t+2}. f_t are the target's final hidden
    states while they are known, then the head's own outputs. The head's cache holds only entries built from
    the target's real features; entries fed during drafting are dropped (the length never covers them)."""

    name = "eagle"

    def setup(self, target: Llama, max_batch: int, max_seq: int) -> None:
        super().setup(target, max_batch, max_seq)
        cfg = LlamaConfig.from_dir(self.path)
        t = target.cfg
        for key in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
            if getattr(cfg, key) != getattr(t, key):
                raise ModelError(f"eagle head: {key} {getattr(cfg, key)} != the target's {getattr(t, key)}",
                                 hint="the EAGLE head must be trained for this target")
        w = load_safetensors(self.path)
        w = {k.removeprefix("model."): v for k, v in w.items()}
        layer = dataclasses.replace(cfg, num_layers=1, tie_word_embeddings=True).num_params - t.vocab_size * t.hidden_size
        head = 2 * t.hidden_size * t.hidden_size + t.vocab_size * t.hidden_size  # fc + the LM head copy
        dt, wdt = target.dtype, self.weight_dtype or draft_dtype(target.dtype, self.device, 4 * (layer + head))
        if "fc.weight" not in w:
            raise ModelError(f"{self.path}: eagle head has no fc.weight")
        self.fc = Linear(w["fc.weight"].to(device=self.device, dtype=dt),
                         w["fc.bias"].to(device=self.device, dtype=dt) if "fc.bias" in w else None, dtype=wdt)
        cfg = dataclasses.replace(cfg, num_layers=1, rope_theta=t.rope_theta, rope_scaling=t.rope_scaling,
                                  max_position_embeddings=t.max_position_embeddings)
        self.net = Llama(cfg, w, dtype=dt, device=self.device, max_seq=max_seq, name="eagle", prefix="",
                         input_norm=False, final_norm=False, embed=target.embed, lm_head=target.lm_head,
                         weight_dtype=wdt)
        self.net.use_onednn_single_row(True)  # runs between target passes: its weights come from memory
        self.fc.min_rows = 1
        self.cache = self.net.new_cache(max_batch, max_seq)
        self.tree = tree_from_choices(self.choices) if self.choices else None
        self.pending: list[list[torch.Tensor]] = [[] for _ in range(max_batch)]

    def max_draft_tokens(self, k: int) -> int:
        return min(k, len(self.tree)) if self.tree else k

    def admit(self, row: int, req: Row, hidden: torch.Tensor) -> None:
        self.cache.lengths[row] = 0
        self.pending[row] = [hidden]

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)
        self.pending[dst], self.pending[src] = self.pending[src], []

    def commit(self, rows: list[Row], paths: list[list[int]], hidden: torch.Tensor) -> None:
        for b, path in enumerate(paths):
            self.pending[b].append(hidden[b, [0] + [j + 1 for j in path]])

    def _run(self, tokens: torch.Tensor, feats: torch.Tensor, inp: StepInputs, last=None):
        """One head pass: (logits at `last` or all, new features [B, T, H])."""
        x = self.fc(torch.cat([F.embedding(tokens, self.net.embed), feats], -1))
        h = self.net.hidden(x, self.cache, inp.positions, inp.start, inp.mask)
        hs = h if last is None else h.gather(1, last[..., None].expand(-1, -1, h.shape[-1]))
        return self.net.logits(hs), h

    def _sync(self, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed every row's not-yet-fed positions (real target features); return the last logits/features."""
        B = len(rows)
        lengths = self.cache.lengths[:B]
        feats = [torch.cat(self.pending[b]) if len(self.pending[b]) != 1 else self.pending[b][0] for b in range(B)]
        n = [f.shape[0] for f in feats]
        T = max(n)
        toks = [r.seq[m + 1:m + 1 + k] for r, m, k in zip(rows, lengths, n)]
        tokens = torch.tensor([t + [0] * (T - len(t)) for t in toks], device=self.device)
        fpad = torch.stack([F.pad(f, (0, 0, 0, T - f.shape[0])) for f in feats]) if B > 1 else feats[0][None]
        last = torch.tensor([[k - 1] for k in n], device=self.device)
        lg, h = self._run(tokens, fpad, chain_inputs(lengths, T, self.device), last)
        for b in range(B):
            self.cache.lengths[b] += n[b]
            self.pending[b] = []
        return lg[:, 0], h.gather(1, last[..., None].expand(-1, -1, h.shape[-1]))[:, 0]

    def propose(self, rows: list[Row], ks: list[int]) -> list[Draft]:
        K, B = max(ks), len(rows)
        if K == 0:
            return [EMPTY] * B
        logits, feat = self._sync(rows)
        base = self.cache.lengths[:B]
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
            mask = torch.arange(S, device=self.device)[None, None, :] < torch.tensor(base, device=self.device)[:, None, None]
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


# ------------------------------------------------------------------------------------------- lookahead (n-gram)

class NgramDrafter(Drafter):
    """Training-free prompt-lookup drafting (the n-gram half of lookahead decoding; no Jacobi branch).

    For match sizes n = ngram .. 1 (longest first) it looks up the row's last n tokens among earlier positions
    of prompt + output and proposes what followed them, up to K tokens. The `verification_set` G most recent
    distinct continuations of the longest size that matches are merged into a trie and verified together.
    `window` (Jacobi lookahead branch) is not used.
    """

    name = "lookahead"

    def __init__(self, ngram: int = 3, verification_set: int = 4):
        self.ngram, self.G = ngram, max(1, verification_set)

    def setup(self, target: Llama, max_batch: int, max_seq: int) -> None:
        super().setup(target, max_batch, max_seq)
        self.index: list[list[dict[tuple[int, ...], list[int]]]] = [[] for _ in range(max_batch)]
        self.done = [0] * max_batch

    def max_draft_tokens(self, k: int) -> int:
        return k

    def max_nodes(self, k: int) -> int:
        return k * self.G

    def admit(self, row: int, req: Row, hidden: torch.Tensor) -> None:
        self.index[row] = [dict() for _ in range(self.ngram + 1)]
        self.done[row] = 0

    def move_row(self, src: int, dst: int) -> None:
        self.index[dst], self.done[dst] = self.index[src], self.done[src]

    def _update(self, b: int, seq: list[int]) -> None:
        idx = self.index[b]
        for j in range(self.done[b], len(seq)):
            for n in range(1, min(self.ngram, j + 1) + 1):
                idx[n].setdefault(tuple(seq[j - n + 1:j + 1]), []).append(j)
        self.done[b] = len(seq)

    def candidates(self, b: int, seq: list[int], k: int) -> list[list[int]]:
        self._update(b, seq)
        end = len(seq) - 1
        for n in range(min(self.ngram, len(seq)), 0, -1):
            found: list[list[int]] = []
            for j in reversed(self.index[b][n].get(tuple(seq[-n:]), ())):
                if j == end:
                    continue
                cont = seq[j + 1:j + 1 + k]
                if cont not in found:
                    found.append(cont)
                    if len(found) == self.G:
                        break
            if found:
                return found
        return []

    def propose(self, rows: list[Row], ks: list[int]) -> list[Draft]:
        drafts = []
        for b, (row, k) in enumerate(zip(rows, ks)):
            drafts.append(trie(self.candidates(b, row.seq, k)) if k else EMPTY)
        return drafts


def trie(seqs: list[list[int]]) -> Draft:
    """Merge token sequences into one tree of draft nodes (shared prefixes once)."""
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}
    for s in seqs:
        at = -1
        for t in s:
            if (at, t) not in child:
                child[(at, t)] = len(tokens)
                tokens.append(t)
                parents.append(at)
            at = child[(at, t)]
    return Draft(tokens, tuple(parents))


def make_drafter(spec) -> Drafter:
    """The drafter a spec asks for (weights load in `setup`)."""
    s = spec.speculative
    dev = spec.runtime.device
    if s.method == "draft-model":
        return DraftModelDrafter(s.draft, dtype=spec.model.dtype, device=dev)
    if s.method == "medusa":
        return MedusaDrafter(s.heads, s.choices, device=dev)
    if s.method == "eagle":
        return EagleDrafter(s.heads, s.choices, device=dev)
    if s.method == "lookahead":
        return NgramDrafter(s.lookahead.ngram, s.lookahead.verification_set)
    return Drafter()
