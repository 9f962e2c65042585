"""suffix: SuffixDecoding (Oliaro et al., arXiv 2411.04975), training-free, with the spec's [speculative.suffix].
The algorithm follows snowflakedb/ArcticInference (`csrc/suffix_decoding/suffix_tree.cc`, `suffix_decoding/
cache.py`; vLLM's method "suffix" wraps it).

    torch          SuffixProposer: a suffix tree over the request's prompt + output, and (off by default) one
                   over the deployment's earlier outputs; the best-scoring path, adaptive length
    runtimes       what the TensorRT-LLM runtimes make of it is their method tables' (docs/architecture.md)
                   (the LLM API's SA is TensorRT-LLM's suffix *automaton*, a different matcher in the same
                   role, documented from 1.3.0rc27)

Privacy: the cross-request cache (`cache_requests` > 0) speculates a request from other requests' outputs, so
one user's text can become another user's draft tokens. Verification keeps every output exactly the target's
(greedy identity, lossless sampling), but drafts are observable (timing, drafted/accepted counts), so the
cache is off unless the spec turns it on, and bounded (requests and tokens, FIFO) when on.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from trtspec.methods.base import Method
from trtspec.runtime.proposer import EMPTY, Draft, DraftPlan, ProposalBatch, Proposer, chain
from trtspec.spec import Spec

if TYPE_CHECKING:
    import torch

NAME = "suffix"
class Node:
    """A suffix-tree node: how often its path occurred, and its children by token."""

    __slots__ = ("count", "kids")

    def __init__(self) -> None:
        self.count = 0
        self.kids: dict[int, Node] = {}


class SuffixTree:
    """Every substring of at most `depth` tokens of the sequences added, with occurrence counts (a suffix trie cut
    at `depth`, as Arctic's max_tree_depth: match + speculation). `extend` adds one sequence token by token in
    O(depth) each (the nodes of the suffixes that end at the last token are kept); `remove` takes a whole
    sequence out again (the cross-request cache's FIFO eviction)."""

    def __init__(self, depth: int):
        self.depth, self.root = depth, Node()

    def open(self) -> list[Node]:
        """The suffix nodes of an empty sequence (pass them to `extend`)."""
        return [self.root]

    def extend(self, active: list[Node], tokens: list[int], sign: int = 1) -> list[Node]:
        """Append `tokens` to the sequence whose suffix nodes are `active` (lengths 0..): counts += sign."""
        for t in tokens:
            nxt = [self.root]
            for node in active[:self.depth]:
                child = node.kids.get(t)
                if child is None:
                    child = node.kids[t] = Node()
                child.count += sign
                if child.count <= 0:
                    del node.kids[t]
                nxt.append(child)
            active = nxt
        return active

    def remove(self, tokens: list[int]) -> None:
        self.extend(self.open(), tokens, sign=-1)

    def find(self, pattern: list[int]) -> Node | None:
        node = self.root
        for t in pattern:
            node = node.kids.get(t)
            if node is None:
                return None
        return node


def speculate_path(node: Node, max_tokens: int, min_prob: float) -> tuple[float, list[int]]:
    """Arctic's `_speculate_path`: follow the most frequent child while the path's estimated probability (the
    product of child.count / node.count) stays >= min_prob; score = the sum of the tokens' probabilities."""
    prob, score, out = 1.0, 0.0, []
    while len(out) < max_tokens and node.kids and node.count > 0:
        tok, child = max(node.kids.items(), key=lambda kv: kv[1].count)
        prob *= child.count / node.count
        if prob < min_prob:
            break
        out.append(tok)
        score += prob
        node = child
    return score, out


def speculate(tree: SuffixTree, context: list[int], k: int, factor: float, offset: float,
              min_prob: float) -> tuple[float, list[int]]:
    """The best draft for `context` from one tree (Arctic suffix_tree.cc): for every match length m = 1 .. depth
    - 1 whose last-m-token pattern is in the tree, a path of at most min(k, int(m·factor + offset), depth - m)
    tokens; the highest score wins, ties to the longer match."""
    best = (0.0, [])
    for m in range(1, min(len(context), tree.depth - 1) + 1):
        node = tree.find(context[-m:])
        if node is None:
            break  # a longer pattern ends with this one: not there either
        n = min(k, int(m * factor + offset + 1e-6), tree.depth - m)
        if n <= 0:
            continue
        score, toks = speculate_path(node, n, min_prob)
        if toks and score >= best[0]:
            best = (score, toks)
    return best


class OutputCache:
    """The deployment's earlier outputs in one suffix tree, bounded: at most `max_requests` outputs and
    `max_tokens` tokens, the oldest dropped first (FIFO, as Arctic's suffix_cache_max_requests)."""

    def __init__(self, depth: int, max_requests: int, max_tokens: int):
        self.tree, self.max_requests, self.max_tokens = SuffixTree(depth), max_requests, max_tokens
        self.outputs: collections.deque[list[int]] = collections.deque()
        self.tokens = 0

    def add(self, output: list[int]) -> None:
        if self.max_requests <= 0 or not output:
            return
        output = list(output[-self.max_tokens:])
        self.tree.extend(self.tree.open(), output)
        self.outputs.append(output)
        self.tokens += len(output)
        while len(self.outputs) > self.max_requests or self.tokens > self.max_tokens:
            old = self.outputs.popleft()
            self.tree.remove(old)
            self.tokens -= len(old)


class _Row:
    __slots__ = ("active", "seen", "prompt_len", "seq")

    def __init__(self, tree: SuffixTree):
        self.active, self.seen, self.prompt_len, self.seq = tree.open(), 0, None, []


class SuffixProposer(Proposer):
    """SuffixDecoding on the torch runtime: each step drafts the best-scoring chain for the row's sequence from
    its own suffix tree (prompt + output, extended as it grows) and, when the cross-request cache is on, from
    the cache of earlier outputs (the higher score wins, Arctic's SuffixDecodingCache.speculate). Its length
    adapts to the match (max_spec_factor · match + max_spec_offset, at most K) and stops where the path's
    frequency estimate falls below min_token_prob. Deterministic candidates: verified as point masses. No match:
    no draft (a plain decode step). A finished request's output enters the cache in `release`."""

    name = NAME

    def __init__(self, max_depth: int = 24, max_spec_factor: float = 1.0, max_spec_offset: float = 0.0,
                 min_token_prob: float = 0.1, cache_requests: int = 0, cache_tokens: int = 1 << 20):
        self.depth, self.factor, self.offset, self.min_prob = (max_depth, max_spec_factor, max_spec_offset,
                                                               min_token_prob)
        self.cache = OutputCache(max_depth, cache_requests, cache_tokens) if cache_requests > 0 else None

    def setup(self, target, max_batch: int, max_seq: int, k: int) -> DraftPlan:
        self.trees: list[SuffixTree | None] = [None] * max_batch
        self.rows: list[_Row | None] = [None] * max_batch
        return DraftPlan.chain(k)

    def admit(self, row: int, hidden: torch.Tensor | None) -> None:
        tree = SuffixTree(self.depth)
        self.trees[row], self.rows[row] = tree, _Row(tree)

    def move_row(self, src: int, dst: int) -> None:
        self.trees[dst], self.rows[dst] = self.trees[src], self.rows[src]
        self.trees[src] = self.rows[src] = None

    def release(self, row: int) -> None:
        st = self.rows[row]
        if st is not None and self.cache is not None and st.prompt_len is not None:
            self.cache.add(st.seq[st.prompt_len:])
        self.trees[row] = self.rows[row] = None

    def propose(self, batch: ProposalBatch) -> list[Draft]:
        out = []
        for b, (seq, k) in enumerate(zip(batch.seqs, batch.ks)):
            tree, st = self.trees[b], self.rows[b]
            if st.prompt_len is None:
                st.prompt_len = len(seq) - 1  # the first step: prompt + the prefill's token
            st.active = tree.extend(st.active, seq[st.seen:])
            st.seen, st.seq = len(seq), seq
            if k <= 0:
                out.append(EMPTY)
                continue
            ctx = seq[-(self.depth - 1):]
            best = speculate(tree, ctx, k, self.factor, self.offset, self.min_prob)
            if self.cache is not None:
                other = speculate(self.cache.tree, ctx, k, self.factor, self.offset, self.min_prob)
                if other[0] > best[0]:
                    best = other
            toks = best[1]
            out.append(Draft(toks, chain(len(toks))) if toks else EMPTY)
        return out


class Suffix(Method):
    name = NAME
    title = "suffix decoding"

    def notes(self, spec: Spec) -> list[str]:
        s = spec.speculative.suffix
        if s.cache_requests > 0:
            return [f"speculative.suffix.cache_requests = {s.cache_requests}: drafts come from other requests' "
                    "outputs too, so one user's text can be speculated into another user's request (outputs stay "
                    "exact); set 0 to keep requests apart"]
        return []

    def proposer(self, spec: Spec, device: str) -> Proposer:
        s = spec.speculative.suffix
        return SuffixProposer(s.max_depth, s.max_spec_factor, s.max_spec_offset, s.min_token_prob,
                              s.cache_requests, s.cache_tokens)
