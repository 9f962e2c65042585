"""The Proposer interface: what proposes the tokens the target verifies (vLLM v1's proposers), and the draft
shapes they share. The implementations live with their methods, one module each (trtspec/methods/<name>.py;
`methods.get(spec.method).proposer(spec, device)` makes one).

Every step the engine hands the proposer a `ProposalBatch` (each running request's sequence, sampling
params, K and its own random draws) and gets one `Draft` per request: a chain or a tree of at most K tokens
deep (also when every K is 0: a stateful proposer may keep in step). It verifies all of them in one target
pass and calls `commit` with each request's accepted node path and the target's final hidden states of that
pass. `commit` uses only what this step's `propose` recorded: requests move between rows between steps.

Rows: request b of a batch sits in row b of the engine's caches, and a proposer that keeps per-request state
(a KV cache, the last hidden state, an n-gram index) keeps it in row b too. The lifecycle hooks say when that
state changes hands: `admit` (a request joins a row, with the target's hidden states over its prompt) and
`move_row` (the engine keeps rows dense: the last row moves into the hole a finished request left).

    class MyProposer(Proposer):
        name = "mine"
        def setup(self, target, max_batch, max_seq, k):  ->  DraftPlan.chain(k)   # load weights, allocate
        def propose(self, batch):                         ->  [Draft(tokens, chain(k)) ...]

A sampled proposer draws its random numbers from `batch.draws[b](n)` (exactly as many as its own K needs, so
a request's output does not depend on what it is batched with) and returns its q (the processed draft
distributions); deterministic candidates leave q None and are verified as point masses (rejection.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where proposals are computed: the method registry is read without it
    import torch

    from trtspec.runtime.sampling import SamplingParams


@dataclasses.dataclass(frozen=True)
class Branch:
    """Inputs a verify pass runs next to a draft but never keeps: Lookahead decoding's lookahead branch (the
    2-D window of Jacobi guesses, Fu et al. 2024), which costs a target forward's rows and gives the target's
    predictions at them. Branch input i sits `depths[i]` positions past the pending token and attends to the
    row's committed slots, to what `sees[i]` lists (0: the pending token, 1 + i': branch input i'; never the
    draft nodes, which never see the branch either) and to itself. Its K/V lands past the kept path, so it is never kept
    (cache.py); the target's argmax at the pending token and at each branch input goes to
    `Proposer.commit_branch`. A proposer reuses its `depths` and `sees` tuples step after step (the window's
    shape is fixed), and the mask structure is cached by them (cache.branch_structure)."""

    tokens: tuple[int, ...]
    depths: tuple[int, ...]
    sees: tuple[tuple[int, ...], ...]


@dataclasses.dataclass
class Draft:
    tokens: list[int]
    parents: tuple[int, ...]  # parent node of each node; -1: the pending token (root)
    q: torch.Tensor | None = None  # [nodes, V] draft distributions; None: deterministic candidates
    branch: Branch | None = None  # inputs run alongside and never kept (lookahead decoding's window)

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
                     None if self.q is None else self.q[keep], self.branch)


EMPTY = Draft([], ())


def chain(n: int) -> tuple[int, ...]:
    """The parents of an n-token chain."""
    return tuple(range(-1, n - 1))


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


@dataclasses.dataclass(frozen=True)
class DraftPlan:
    """What a proposer drafts given the spec's K: the largest K it honours, the (K, depth of the draft it
    gives) choices adaptive K picks from, and whether K is a depth (a chain: the engine caps it by what a
    request can still keep) or a tree's node budget (the engine prunes nodes deeper than that). A drafting
    step of budget K verifies `fixed_rows + width·K` rows besides the pending token (adaptive.Price)."""

    k_max: int
    options: tuple[tuple[int, int], ...]
    k_is_depth: bool = True
    fixed_rows: int = 0   # rows each drafting step verifies whatever K (lookahead's window)
    width: float = 1.0    # verified rows per unit of K before a request's drafts teach it (lookahead: G)

    @classmethod
    def chain(cls, k_max: int) -> "DraftPlan":
        return cls(k_max, tuple((k, k) for k in range(1, k_max + 1)))

    @classmethod
    def tree(cls, tree: list[tuple[int, int, int]], k: int) -> "DraftPlan":
        k_max = min(k, len(tree))
        return cls(k_max, tuple(tree_options(tree, k_max)), k_is_depth=False)

    @property
    def max_depth(self) -> int:
        return max((d for _, d in self.options), default=0)


@dataclasses.dataclass(slots=True)
class ProposalBatch:
    """One step's running requests as a proposer sees them; index b is request b's row."""

    seqs: list[list[int]]       # prompt + generated; the last token is *pending* (emitted, not yet run)
    params: list[SamplingParams]
    ks: list[int]               # how deep (a chain) or how many nodes (a tree) each request may draft
    draws: list[Callable[[int], list[float]]]  # draws[b](n): n uniforms from request b's own generator

    def __len__(self) -> int:
        return len(self.seqs)


class Proposer:
    """The interface, and plain decoding (it proposes nothing)."""

    name = "none"

    def max_nodes(self, k: int) -> int:
        """Upper bound on the draft nodes of one step when drafting up to k (asked before `setup`: the
        engine sizes its caches with it)."""
        return k

    def setup(self, target, max_batch: int, max_seq: int, k: int) -> DraftPlan:
        """Load weights and allocate per-row state for `max_batch` rows of `max_seq` slots next to `target`
        (a trtspec.runtime.llama.Llama); return what can be drafted given the spec's K."""
        return DraftPlan.chain(0)

    def admit(self, row: int, hidden: torch.Tensor) -> None:
        """A request entered `row`; hidden [P, H]: the target's final hidden states over its prompt."""

    def move_row(self, src: int, dst: int) -> None:
        """The request in row `src` now lives in row `dst`."""

    def propose(self, batch: ProposalBatch) -> list[Draft]:
        return [EMPTY] * len(batch)

    def commit(self, paths: list[list[int]], hidden: torch.Tensor) -> None:
        """After verification: paths[b] = request b's accepted draft nodes; hidden [B, T, H] of the verify
        inputs (input 0: the pending token, input 1 + j: draft node j)."""

    def commit_branch(self, outputs: list[list[int] | None]) -> None:
        """After verification, before `commit`, when some draft had a Branch: outputs[b] = the target's argmax
        at row b's pending token followed by one per branch input (None: that row ran no branch)."""

    def release(self, row: int) -> None:
        """The request in `row` ended (before its row is refilled or another row moves into it)."""

    def lag(self, row: int, length: int) -> int:
        """Tokens of row's sequence (`length` long, its pending token included) that this proposer's state has
        not seen and must take in before it drafts, besides the pending token (a draft model's cache falls
        behind while its request decodes plainly)."""
        return 0


class HeadProposer(Proposer):
    """A proposer whose weights (a heads dir) ride on the target and whose candidates are top-i tokens (Medusa,
    EAGLE): a chain of top-1s, or the tree of `choices` (node [i, j, ..]: the top-i token at depth 1, the
    top-j below it, ...). Deterministic candidates: verified as point masses."""

    def __init__(self, path: str | Path, choices: Sequence[Sequence[int]] | None = None, device: str = "cpu",
                 weight_dtype: torch.dtype | None = None):
        self.path, self.choices, self.device, self.weight_dtype = Path(path), choices, device, weight_dtype
        self.tree = tree_from_choices(choices) if choices else None  # None: a chain

    def plan(self, k: int, max_depth: int | None = None) -> DraftPlan:
        """The tree's first k nodes, or a chain of k (at most max_depth) tokens."""
        if self.tree:
            return DraftPlan.tree(self.tree, k)
        return DraftPlan.chain(k if max_depth is None else min(k, max_depth))
