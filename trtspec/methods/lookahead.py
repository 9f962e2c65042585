"""lookahead: Lookahead decoding (Fu et al., ICML 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding"; reference code hao-ai-lab/LookaheadDecoding `lade/decoding.py`), training-free, with the
spec's [speculative.lookahead] W, N, G — TensorRT-LLM's lookahead_window_size / lookahead_ngram_size /
lookahead_verification_set_size, 1:1.

    torch          LookaheadProposer: the lookahead branch (a 2-D window of Jacobi guesses, W columns x N - 1
                   levels) and the verification branch (up to G pooled n-grams that start with the pending
                   token) in ONE target forward with one attention mask (cache.branch_inputs)
    runtimes       what the TensorRT-LLM runtimes make of it is their method tables' (docs/architecture.md)
                   (trtllm-engine: max_draft_len (N-2) + (W-1+G)(N-1); the LLM API refuses it: prompt lookup
                   there is method `ngram`)

Method `lookahead` used to be prompt lookup; such specs keep working (same keys) and now run Jacobi lookahead
decoding; `trtspec check` says so and points at method `ngram` (`deprecation`).
"""

from __future__ import annotations

import random
import zlib
from typing import TYPE_CHECKING

from trtspec.methods.base import Method
from trtspec.runtime.proposer import EMPTY, Branch, Draft, DraftPlan, ProposalBatch, Proposer, trie
from trtspec.spec import Problem, Spec

if TYPE_CHECKING:
    import torch

NAME = "lookahead"
DEPRECATION = ("method 'lookahead' is now Jacobi lookahead decoding (W, N, G as TensorRT-LLM's); use method "
               "'ngram' ([speculative.ngram]) for the prompt lookup it meant before")


def lookahead_max_draft_len(window: int, ngram: int, verification_set: int) -> int:
    """TensorRT-LLM's engine `max_draft_len` for lookahead (W, N, G) (examples/lookahead/README.md). It is
    exactly the inputs one lookahead step adds after the pending token: (N-1)W - 1 window cells plus G(N-1)
    verification tokens (LookaheadProposer.max_nodes)."""
    return (0 if ngram == 1 else ngram - 2) + (window - 1 + verification_set) * (ngram - 1)


def window_shape(W: int, N: int) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """(depths, sees) of the lookahead branch (proposer.Branch), LADE's layout and mask: level 0 holds columns
    1..W-1 (column 0 is the pending token itself), levels 1..N-2 hold columns 0..W-1; cell (l, c) sits l + c
    positions past the pending token and sees level 0's columns <= c and its own column's cells of levels
    1..l, i.e. one contiguous trajectory: its output is the Jacobi guess for the position after it. Branch
    inputs are numbered level by level (see `cell`)."""
    depths, sees = [], []
    for lvl in range(N - 1):
        for c in range(1 if lvl == 0 else 0, W):
            depths.append(lvl + c)
            seen = [0] + [cell(W, 0, j) for j in range(1, c + 1)] + [cell(W, r, c) for r in range(1, lvl + 1)]
            sees.append(tuple(seen))
    return tuple(depths), tuple(sees)


def cell(W: int, lvl: int, c: int) -> int:
    """Branch.sees index of window cell (level, column): 0 is the pending token (level 0, column 0)."""
    return c if lvl == 0 else W + (lvl - 1) * W + c


def jacobi_step(levels: list[list[int]], top: list[int]) -> list[list[int]]:
    """The window after one step (LADE's ALWAYS_FWD_ONE update): every level moves down one (the pending token
    advanced), level 0 drops the column the new pending token takes, `top` (the target's argmax at the last
    level's W cells) becomes the last level. levels[0] has W - 1 tokens (columns 1..W-1), the others W."""
    stack = levels + [top]
    return [stack[1][1:]] + [list(x) for x in stack[2:]]


def column_ngrams(pending: int, levels: list[list[int]], top: list[int]) -> list[tuple[int, tuple[int, ...]]]:
    """The W n-grams one step's trajectories give (LADE update_token_map): column c's key is its level-0 token
    (column 0: the pending token), followed by its cells of levels 1..N-2 and the new guess top[c]."""
    W = len(top)
    out = []
    for c in range(W):
        key = pending if c == 0 else levels[0][c - 1]
        out.append((key, tuple(lv[c] for lv in levels[1:]) + (top[c],)))
    return out


class Pool:
    """The n-gram pool of one request: key token -> at most G (N-1)-token continuations, LRU (LADE's
    token_map with GUESS_SET_SIZE): a continuation seen again moves to the newest end, a new one past G
    drops the oldest."""

    def __init__(self, G: int):
        self.G, self.map = G, {}

    def add(self, key: int, tail: tuple[int, ...]) -> None:
        lst = self.map.setdefault(key, [])
        if tail in lst:
            lst.remove(tail)
        elif len(lst) >= self.G:
            del lst[0]
        lst.append(tail)

    def get(self, key: int) -> list[tuple[int, ...]]:
        """Newest first (fresh trajectories are the likelier ones)."""
        return self.map.get(key, [])[::-1]


class _Row:
    """One request's lookahead state: the window, the pool, steps since the window last ran each step."""

    __slots__ = ("levels", "pool", "warm", "seen", "ran")

    def __init__(self, levels: list[list[int]], G: int):
        self.levels, self.pool, self.warm, self.seen, self.ran = levels, Pool(G), 0, 0, None


class LookaheadProposer(Proposer):
    """Lookahead decoding on the torch runtime.

    Each drafting step row b sends, after its pending token x, (1) the verification branch: the trie of up to
    G pooled n-grams whose key is x (each cut to K tokens), and (2) the lookahead branch: the window's
    (N-1)W - 1 cells (a proposer.Branch, never kept in the KV cache). The target's argmax at the last level's
    cells is the next Jacobi iteration (`jacobi_step`); each column's trajectory becomes an n-gram of the
    pool (`column_ngrams`, once the window has run N-2 steps: before, its levels are still the random
    start). As in LADE with POOL_FROM_PROMPT, the request's own n-grams (prompt and output) enter the pool
    too, so text that repeats is found at once. Acceptance is the rejection sampler's tree verification of
    deterministic candidates: greedy = token identity; sampling = accept candidate d with probability
    p(d), else remove d from p, renormalise and try the next (LADE's rule "modified from SpecInfer").

    A step with K = 0 (adaptive fallback, or a request asking for none) sends neither branch: it costs a
    plain decode step. The window starts as tokens drawn from the prompt (LADE `copy_from`), seeded by the
    prompt so a request's drafts depend on nothing else.
    """

    name = NAME

    def __init__(self, window: int = 4, ngram: int = 3, verification_set: int = 4):
        if ngram < 2:
            raise ValueError("lookahead decoding needs n-grams of length >= 2")
        self.W, self.N, self.G = max(1, window), ngram, verification_set
        depths, sees = window_shape(self.W, self.N)
        self.depths, self.sees = depths, sees

    def max_nodes(self, k: int) -> int:
        return self.G * min(k, self.N - 1) + len(self.depths)

    def setup(self, target, max_batch: int, max_seq: int, k: int) -> DraftPlan:
        self.rows: list[_Row | None] = [None] * max_batch
        self.last: list[tuple | None] = [None] * max_batch  # (levels before, top) of the last step (tests)
        if k <= 0 or self.G == 0:
            return DraftPlan.chain(0)
        # adaptive K's rows: the window's every drafting step, up to G candidates per unit of K
        return DraftPlan(k, tuple((j, min(j, self.N - 1)) for j in range(1, k + 1)),
                         fixed_rows=len(self.depths), width=self.G)

    def admit(self, row: int, hidden: torch.Tensor | None) -> None:
        self.rows[row] = None  # built from the prompt at its first propose
        self.last[row] = None

    def move_row(self, src: int, dst: int) -> None:
        self.rows[dst], self.rows[src] = self.rows[src], None
        self.last[dst] = self.last[src]

    def release(self, row: int) -> None:
        self.rows[row] = None

    def _start(self, seq: list[int]) -> _Row:
        rng = random.Random(zlib.crc32(repr(seq).encode()))
        levels = [[rng.choice(seq) for _ in range(self.W - 1)]]
        levels += [[rng.choice(seq) for _ in range(self.W)] for _ in range(self.N - 2)]
        return _Row(levels, self.G)

    def _learn_seq(self, st: _Row, seq: list[int]) -> None:
        """The request's own n-grams (key + N - 1 tokens) that `seq` completed since the last call."""
        N = self.N
        for j in range(max(st.seen, N - 1), len(seq)):
            st.pool.add(seq[j - N + 1], tuple(seq[j - N + 2:j + 1]))
        st.seen = len(seq)

    def propose(self, batch: ProposalBatch) -> list[Draft]:
        out = []
        for b, (seq, k) in enumerate(zip(batch.seqs, batch.ks)):
            st = self.rows[b]
            if st is None:
                st = self.rows[b] = self._start(seq)
            self._learn_seq(st, seq)
            if k <= 0:
                st.warm, st.ran = 0, None  # the window stops with the step; it restarts warming up
                out.append(EMPTY)
                continue
            cands = [list(t[:k]) for t in st.pool.get(seq[-1])]
            d = trie(cands)
            tokens = tuple(t for lv in st.levels for t in lv)
            st.ran = seq[-1]
            out.append(Draft(d.tokens, d.parents, None, Branch(tokens, self.depths, self.sees)))
        return out

    def commit_branch(self, outputs: list[list[int] | None]) -> None:
        W, N = self.W, self.N
        for b, o in enumerate(outputs):
            st = self.rows[b] if b < len(self.rows) else None
            if o is None or st is None or st.ran is None:
                continue
            # the last level's W cells (N = 2: the pending token and level 0)
            top = o[cell(W, N - 2, 0):cell(W, N - 2, W - 1) + 1]
            if st.warm >= N - 2:
                for key, tail in column_ngrams(st.ran, st.levels, top):
                    st.pool.add(key, tail)
            self.last[b] = ([list(lv) for lv in st.levels], list(top))
            st.levels = jacobi_step(st.levels, list(top))
            st.warm += 1
            st.ran = None


class Lookahead(Method):
    name = NAME
    title = "lookahead decoding"

    def problems(self, spec: Spec) -> list[Problem]:
        p = super().problems(spec)
        if spec.speculative.lookahead.ngram < 2:
            p.append(Problem("speculative.lookahead.ngram", spec.speculative.lookahead.ngram,
                             "lookahead needs n-grams of length >= 2", "set ngram >= 2"))
        return p

    def notes(self, spec: Spec) -> list[str]:
        return [DEPRECATION]

    def proposer(self, spec: Spec, device: str) -> Proposer:
        la = spec.speculative.lookahead
        return LookaheadProposer(la.window, la.ngram, la.verification_set)
