"""lookahead: training-free prompt-lookup n-grams, verified together as a trie (the spec's [speculative.lookahead]
W, N, G).

    torch          NgramProposer: the n-gram half of lookahead decoding (no Jacobi branch; W unused)
    trtllm-build   --speculative_decoding_mode lookahead_decoding --max_draft_len f(W, N, G) (at most 256)
    repository     decoding_mode lookahead, lookahead_window_size / _ngram_size / _verification_set_size
    LLM API        speculative_config NGram (prompt lookup: LookaheadDecodingConfig is TensorRT-engine only)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtspec.convert import params
from trtspec.methods.base import TARGET, Method
from trtspec.runtime.proposer import EMPTY, Draft, DraftPlan, ProposalBatch, Proposer, trie
from trtspec.spec import Problem, Spec

if TYPE_CHECKING:
    import torch

NAME = "lookahead"


def lookahead_max_draft_len(window: int, ngram: int, verification_set: int) -> int:
    """TensorRT-LLM's engine `max_draft_len` for lookahead (W, N, G) (examples/lookahead/README.md)."""
    return (0 if ngram == 1 else ngram - 2) + (window - 1 + verification_set) * (ngram - 1)


class NgramProposer(Proposer):
    """Training-free prompt-lookup drafting (the n-gram half of lookahead decoding; no Jacobi branch).

    For match sizes n = ngram .. 1 (longest first) it looks up the row's last n tokens among earlier positions
    of prompt + output and proposes what followed them, up to K tokens. The `verification_set` G most recent
    distinct continuations of the longest size that matches are merged into a trie and verified together
    (deterministic candidates: point masses). `window` (Jacobi lookahead branch) is not used. State per row:
    an n-gram index of the row's sequence, extended as it grows.
    """

    name = NAME

    def __init__(self, ngram: int = 3, verification_set: int = 4):
        self.ngram, self.G = ngram, max(1, verification_set)

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
        """Up to G continuations (at most k tokens each) of the longest n-gram that ends `seq` and occurred
        before, newest first; row b's index is extended with what `seq` added since the last call."""
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

    def propose(self, batch: ProposalBatch) -> list[Draft]:
        return [trie(self.candidates(b, seq, k)) if k else EMPTY for b, (seq, k) in enumerate(zip(batch.seqs, batch.ks))]


def ngram_config(spec: Spec) -> dict[str, Any]:
    """The LLM API's n-gram (prompt lookup) drafter for a lookahead-like spec: K draft tokens, matching
    (N - 1)-grams. Method `lookahead` maps to it under the LLM API."""
    la = spec.speculative.lookahead
    return {"decoding_type": "NGram", "max_draft_len": spec.speculative.num_draft_tokens,
            "max_matching_ngram_size": max(la.ngram - 1, 1), "is_keep_all": True, "is_use_oldest": True,
            "is_public_pool": True}


class Lookahead(Method):
    name = NAME
    title = "lookahead"
    trtllm_engine = True
    speculative_decoding_mode = "lookahead_decoding"
    draft_len_flag = True
    decoding_mode = "lookahead"
    llmapi_refusal = None

    def problems(self, spec: Spec) -> list[Problem]:
        p = super().problems(spec)
        if spec.speculative.lookahead.ngram < 2:
            p.append(Problem("speculative.lookahead.ngram", spec.speculative.lookahead.ngram,
                             "lookahead needs n-grams of length >= 2", "set ngram >= 2"))
        return p

    def engine_problems(self, spec: Spec, pp: int | None = None) -> list[Problem]:
        p = super().engine_problems(spec, pp)
        if (why := params.draft_len_excess(self.max_draft_len(spec))) is not None:
            p.append(Problem("speculative.lookahead", spec.speculative.lookahead.model_dump(), f"needs {why}",
                             "use a smaller window, ngram or verification_set"))
        return p

    def proposer(self, spec: Spec, device: str) -> Proposer:
        return NgramProposer(spec.speculative.lookahead.ngram, spec.speculative.lookahead.verification_set)

    def max_draft_len(self, spec: Spec) -> int:
        la = spec.speculative.lookahead
        return lookahead_max_draft_len(la.window, la.ngram, la.verification_set)

    def backend_parameters(self, spec: Spec, role: str) -> dict[str, str]:
        la = spec.speculative.lookahead
        return {"lookahead_window_size": str(la.window), "lookahead_ngram_size": str(la.ngram),
                "lookahead_verification_set_size": str(la.verification_set)} if role == TARGET else {}

    def llmapi_options(self, spec: Spec) -> dict[str, Any]:
        return {"speculative_config": ngram_config(spec)}
