"""The static KV cache and the (positions, slots, mask) a forward step needs.

Layout: k, v = [layers, batch, kv_heads, max_seq, head_dim], allocated once. Each row (one request) keeps a
length: its first `lengths[row]` slots hold committed tokens. A step writes its new tokens at slots
length..length+T-1 and the caller then *chooses* how many to keep:
- rejecting draft tokens = setting the length back (nothing is copied or cleared: stale slots past the length
  are never attended to, because every mask only admits slots < length plus the step's own entries);
- keeping a tree path whose nodes are not the first ones = `keep_path`, which gathers only the accepted
  nodes' K/V into place (one small gather per k/v over all layers).

Rows are kept dense: active requests occupy rows 0..n-1 (`move_row` fills a freed row with the last one), so
a step runs on a plain slice of the cache, never on an index-gathered copy.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import torch


class KVCache:
    def __init__(self, num_layers: int, batch: int, kv_heads: int, max_seq: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        shape = (num_layers, batch, kv_heads, max_seq, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = [0] * batch
        self.max_seq = max_seq

    @property
    def batch(self) -> int:
        return len(self.lengths)

    def keep_path(self, row: int, base: int, offsets: list[int]) -> None:
        """Keep the entries at slots base+offsets[i] as slots base+i (a tree path) and set the length after them."""
        n = len(offsets)
        if offsets != list(range(n)):  # a chain prefix is already in place
            src = torch.tensor([base + o for o in offsets], device=self.k.device)
            dst = torch.arange(base, base + n, device=self.k.device)
            self.k[:, row, :, dst] = self.k[:, row, :, src]
            self.v[:, row, :, dst] = self.v[:, row, :, src]
        self.lengths[row] = base + n

    def move_row(self, src: int, dst: int) -> None:
        if src != dst:
            n = self.lengths[src]
            self.k[:, dst, :, :n] = self.k[:, src, :, :n]
            self.v[:, dst, :, :n] = self.v[:, src, :, :n]
            self.lengths[dst] = n
        self.lengths[src] = 0


@dataclasses.dataclass
class StepInputs:
    """Where a step's T new tokens go (start: first slot per row), their RoPE positions and the attention mask."""

    positions: torch.Tensor  # [B, T]
    start: list[int]  # [B]
    mask: torch.Tensor | None  # [B, 1, T, S] bool, None: one row attending to everything before it


_ARANGE: dict[str, torch.Tensor] = {}


def _arange(n: int, device) -> torch.Tensor:
    """A cached arange of at least n (views of it are free; building one costs a few microseconds)."""
    key = str(device)
    a = _ARANGE.get(key)
    if a is None or a.numel() < n:
        a = _ARANGE[key] = torch.arange(max(n, 4096), device=device)
    return a


def chain_inputs(lengths: list[int], T: int, device="cpu") -> StepInputs:
    """Each row appends T tokens (right-padded rows included) as a causal chain after its `lengths[b]` slots."""
    B = len(lengths)
    if B == 1:
        n = lengths[0]
        positions = _arange(n + T, device)[n:n + T].view(1, T)
        return StepInputs(positions, list(lengths), None if T == 1 else _causal_tail(n, T, device))
    base = torch.tensor(lengths, device=device)
    positions = base[:, None] + torch.arange(T, device=device)[None, :]
    S = max(lengths) + T
    mask = torch.arange(S, device=device)[None, None, :] <= positions[:, :, None]
    return StepInputs(positions, list(lengths), mask[:, None])


def _causal_tail(length: int, T: int, device) -> torch.Tensor:
    return (torch.arange(length + T, device=device)[None, :] <= (length + torch.arange(T, device=device))[:, None]
            )[None, None]


def tree_inputs(lengths: list[int], trees: list[tuple[int, ...]], device="cpu") -> StepInputs:
    """Each row appends a tree of inputs after its `lengths[b]` slots, input i at slot length+i.

    trees[b] = parent index of each input (-1 for a root; parents before children). Input i sits at position
    length + depth(i) and attends to the row's committed slots plus its own ancestors and itself. Rows with
    fewer inputs are padded with self-attending singletons.
    """
    T = max(len(t) for t in trees)
    pos, anc = [], []
    for parents in trees:
        depth, a = tree_structure(tuple(parents), T)
        pos.append(depth)
        anc.append(a)
    return _appended_inputs(lengths, pos, anc, T, device)


def draft_inputs(lengths: list[int], parents: list[tuple[int, ...]], T: int, device="cpu",
                 branches: list | None = None) -> StepInputs:
    """A verify pass's inputs: per row [pending token, draft nodes..., branch inputs...] after its `lengths[b]`
    slots, draft node j with parent `parents[b][j]` (-1: the pending token); a causal chain when every draft is
    a chain and no row has a branch (proposer.Branch), else per-row masks (padded to T)."""
    if branches and any(br is not None for br in branches):
        return branch_inputs(lengths, parents, branches, T, device)
    if all(all(p == i - 1 for i, p in enumerate(ps)) for ps in parents):
        return chain_inputs(lengths, T, device)
    return tree_inputs(lengths, [(-1,) + tuple(p + 1 for p in ps) for ps in parents], device)


def branch_inputs(lengths: list[int], parents: list[tuple[int, ...]], branches: list, T: int,
                  device="cpu") -> StepInputs:
    """Rows of [pending token, draft tree, branch inputs] (a branch: proposer.Branch or None): the tree as in
    tree_inputs, each branch input at position length + its depth, seeing the row's committed slots, the
    pending token and branch inputs it lists, and itself (Lookahead decoding's one attention mask for both branches,
    LADE `j_make_causal_mask_multilevel`). Padding inputs attend to themselves only."""
    pos, vis = [], []
    for ps, br in zip(parents, branches):
        depth, v = branch_structure(tuple(ps), None if br is None else (br.depths, br.sees), T)
        pos.append(depth)
        vis.append(v)
    return _appended_inputs(lengths, pos, vis, T, device)


def _appended_inputs(lengths: list[int], depths: list[torch.Tensor], sees: list[torch.Tensor], T: int,
                     device) -> StepInputs:
    """T inputs appended per row after its `lengths[b]` slots: input i at position length + depths[b][i],
    attending to every committed slot of its row and to the appended inputs sees[b][i] ([T, T] bool)."""
    B = len(lengths)
    base = torch.tensor(lengths, device=device)
    positions = base[:, None] + torch.stack(depths).to(device)
    S = max(lengths) + T
    mask = (torch.arange(S, device=device)[None, None, :] < base[:, None, None]).expand(B, T, S).clone()
    slots = base[:, None] + torch.arange(T, device=device)[None, :]
    mask.scatter_(2, slots[:, None, :].expand(B, T, T), torch.stack(sees).to(device))
    return StepInputs(positions, list(lengths), mask[:, None])


@lru_cache(maxsize=512)
def branch_structure(parents: tuple[int, ...], branch: tuple[tuple[int, ...], tuple[tuple[int, ...], ...]] | None,
                     T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(position offset [T], visibility [T, T]) of [pending, draft nodes with `parents`, branch inputs]: the
    nodes see their ancestors (tree_structure of the root-prefixed tree), a branch input (depths, sees) what it
    lists and itself; the rest is padding, isolated at increasing offsets."""
    n = len(parents) + 1
    depth, vis = tree_structure((-1,) + tuple(p + 1 for p in parents), T)
    depth, vis = depth.clone(), vis.clone()
    if branch is not None:
        depths, sees = branch
        for i, (d, seen) in enumerate(zip(depths, sees)):
            at = n + i
            depth[at] = d
            vis[at, [0 if s == 0 else n + s - 1 for s in seen]] = True
        m = n + len(depths)
        depth[m:] = torch.arange(m, T) if m < T else depth[m:]
    return depth, vis


@lru_cache(maxsize=512)
def tree_structure(parents: tuple[int, ...], T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(depth [T], ancestor-or-self matrix [T, T]) of a parent list, padded to T with isolated nodes."""
    n = len(parents)
    anc = torch.eye(T, dtype=torch.bool)
    depth = torch.zeros(T, dtype=torch.long)
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
            depth[i] = depth[p] + 1
    depth[n:] = torch.arange(n, T) if n < T else depth[n:]
    return depth, anc
