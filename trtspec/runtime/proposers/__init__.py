"""The Proposer implementations (trtspec/runtime/proposer.py has the interface), one self-contained module each.

| method      | proposes                                                     | state kept per row            |
|-------------|--------------------------------------------------------------|-------------------------------|
| none        | nothing (plain decoding: the base Proposer)                  | -                             |
| draft-model | a chain sampled from a small LM's processed distribution q   | its KV cache (rolled back)    |
| medusa      | top-i candidates of heads on the target's last hidden state; | the last hidden state         |
|             | a chain of top-1s, or the tree in `choices`                  |                               |
| eagle       | top-i candidates of a one-layer feature-level head run       | its KV cache + target features|
|             | autoregressively; a chain, or the tree in `choices`          | not yet fed                   |
| lookahead   | prompt-lookup n-grams: continuations of the latest matches   | an n-gram index of the row    |
|             | of the sequence's last n tokens, up to G of them as a trie   |                               |

Medusa, EAGLE and n-gram candidates are deterministic, so they are verified as point-mass drafts
(rejection.py): exact for greedy and for sampling. The draft model's samples carry their q.
"""

from __future__ import annotations

from trtspec.runtime.proposer import Proposer
from trtspec.runtime.proposers.draft_model import DraftModelProposer
from trtspec.runtime.proposers.eagle import EagleProposer
from trtspec.runtime.proposers.medusa import MedusaProposer
from trtspec.runtime.proposers.ngram import NgramProposer

__all__ = ["DraftModelProposer", "EagleProposer", "MedusaProposer", "NgramProposer", "make_proposer"]


def make_proposer(spec) -> Proposer:
    """The proposer a spec asks for (weights load in `setup`)."""
    s = spec.speculative
    dev = spec.runtime.device
    if s.method == "draft-model":
        return DraftModelProposer(s.draft, dtype=spec.model.dtype, device=dev)
    if s.method == "medusa":
        return MedusaProposer(s.heads, s.choices, device=dev)
    if s.method == "eagle":
        return EagleProposer(s.heads, s.choices, device=dev)
    if s.method == "lookahead":
        return NgramProposer(s.lookahead.ngram, s.lookahead.verification_set)
    return Proposer()
