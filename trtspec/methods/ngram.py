"""ngram: training-free prompt lookup (the spec's [speculative.ngram]); this used to be method `lookahead`, which
is now Jacobi lookahead decoding (lookahead.py).

    torch          NgramProposer: the longest n-gram (<= max_matching) that ends the sequence and occurred
                   before proposes what followed it; up to `candidates` continuations merged into a trie
    runtimes       what the TensorRT-LLM runtimes make of it is their method tables' (docs/architecture.md)

A step that finds no match drafts nothing and costs a plain decode step; matches that keep failing lower the
request's acceptance and adaptive K falls back to plain decoding (runtime/adaptive.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtspec.methods.base import Method
from trtspec.runtime.proposer import EMPTY, Draft, DraftPlan, ProposalBatch, Proposer, trie
from trtspec.spec import Problem, Spec

if TYPE_CHECKING:
    import torch

NAME = "ngram"


class NgramProposer(Proposer):
    """Prompt lookup: for match sizes n = ngram .. 1 (longest first) it looks the row's last n tokens up among
    earlier positions of prompt + output and proposes what followed them, up to K tokens. The G most recent
    distinct continuations of the longest size that matches are merged into a trie and verified together
    (deterministic candidates: point masses). State per row: an n-gram index of the row's sequence, extended
    as it grows."""

    name = NAME

    def __init__(self, ngram: int = 3, verification_set: int = 4, min_ngram: int = 1):
        self.ngram, self.G, self.min_ngram = ngram, max(1, verification_set), max(1, min_ngram)

    def max_nodes(self, k: int) -> int:
        return k * self.G

    def setup(self, target, max_batch: int, max_seq: int, k: int) -> DraftPlan:
        self.index: list[list[dict[tuple[int, ...], list[int]]]] = [[] for _ in range(max_batch)]
        self.done = [0] * max_batch
        return DraftPlan.chain(k)

    def admit(self, row: int, hidden: torch.Tensor | None) -> None:
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
        """Up to G continuations (at most k tokens each) of the longest n-gram (at least min_ngram long) that
        ends `seq` and occurred before, newest first; row b's index is extended with what `seq` added since the
        last call."""
        self._update(b, seq)
        end = len(seq) - 1
        for n in range(min(self.ngram, len(seq)), self.min_ngram - 1, -1):
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

    def propose(self, batch: ProposalBatch) -> list[Draft]:
        return [trie(self.candidates(b, seq, k)) if k else EMPTY
                for b, (seq, k) in enumerate(zip(batch.seqs, batch.ks))]


class Ngram(Method):
    name = NAME
    title = "n-gram prompt lookup"

    def proposer(self, spec: Spec, device: str) -> Proposer:
        ng = spec.speculative.ngram
        return NgramProposer(ng.max_matching, ng.candidates, ng.min_matching)

    def problems(self, spec: Spec) -> list[Problem]:
        p, ng = super().problems(spec), spec.speculative.ngram
        if ng.min_matching > ng.max_matching:
            p.append(Problem("speculative.ngram.min_matching", ng.min_matching,
                             f"the shortest match must not be longer than the longest ({ng.max_matching})",
                             "set min_matching <= max_matching"))
        return p
