"""none: plain decoding (K = 0): the base Proposer proposes nothing (the TensorRT-LLM runtimes: a plain engine,
the LLM API without a speculative_config)."""

from __future__ import annotations

from trtspec.methods.base import Method
from trtspec.runtime.proposer import Proposer
from trtspec.spec import Spec


class Plain(Method):
    name = Proposer.name  # "none"
    title = "plain decoding"
    drafts = False

    def proposer(self, spec: Spec, device: str) -> Proposer:
        return Proposer()
