"""Speculative-decoding statistics, defined once (as vLLM v1's SpecDecodingStats) and read by every consumer:
the engine's results, the Prometheus exporter, the gRPC client, the benchmarks and the CLI.

    tokens per step = tokens emitted by verify steps / verify steps

A *verify step* is one target pass of one request after its prefill; the prefill's first token is not a
step's (so plain decoding reads 1.0, and a step that accepts all K drafts K + 1). With no verify step (one
token asked for, EOS at once, a server that does not count steps) it is 0.0. Acceptance rate = accepted /
drafted draft tokens (a tree counts every node as drafted), 0.0 with nothing drafted.

No torch here: the client and the served pre/postprocessing models import it.
"""

from __future__ import annotations

import dataclasses


def tokens_per_step(tokens: int, steps: int) -> float:
    """Tokens emitted by `steps` verify steps per step (0.0 with no step); see the module docstring."""
    return tokens / steps if steps else 0.0


def acceptance_rate(accepted: int, drafted: int) -> float:
    return accepted / drafted if drafted else 0.0


@dataclasses.dataclass(slots=True)
class SpecDecodingStats:
    """One engine step (every active request verified in one target pass). Lists hold one entry per request
    of the step; the totals are computed when read, so the step loop only builds four lists."""

    depths: list[int]        # depth of each request's draft (0: it drafted nothing this step)
    drafted: list[int]       # draft tokens (nodes) proposed
    accepted: list[int]      # draft tokens accepted (the length of the accepted path)
    emitted: list[int]       # tokens emitted (accepted + 1, or fewer when a stop condition cut the step)
    draft_seconds: float     # proposing + committing the proposer's state (once for the whole batch)
    verify_seconds: float    # the target pass + the rejection sampler
    drafters: list[int] = dataclasses.field(default_factory=list)  # each request's drafter (a routed engine), else []

    @property
    def batch_size(self) -> int:
        return len(self.emitted)

    @property
    def num_drafts(self) -> int:
        """Requests that drafted at least one token (vLLM's num_drafts: the per-position denominator)."""
        return sum(1 for n in self.drafted if n)

    @property
    def num_draft_tokens(self) -> int:
        return sum(self.drafted)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(self.accepted)

    @property
    def num_emitted_tokens(self) -> int:
        return sum(self.emitted)

    @property
    def accepted_per_position(self) -> list[int]:
        """[i]: requests whose accepted path reached depth i + 1 (position 0 = the first draft token)."""
        return [sum(1 for a in self.accepted if a > i) for i in range(max(self.depths, default=0))]


@dataclasses.dataclass(slots=True)
class RequestStats:
    """What one request has done so far, summed from its StepEvents (`observe`): the engine's results, the
    served model's per-response counters and the CLI's stream all add events up here."""

    events: int = 0
    tokens: int = 0          # all tokens emitted, the prefill's first one included
    steps: int = 0           # verify steps: every event after the first that carries tokens
    step_tokens: int = 0     # tokens those steps emitted
    drafted: int = 0
    accepted: int = 0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0

    def observe(self, event) -> None:
        """Add one StepEvent (trtspec.runtime.engine): the first is the prefill's (or an early final one)."""
        n = len(event.tokens)
        if self.events and n:
            self.steps += 1
            self.step_tokens += n
        self.events += 1
        self.tokens += n
        self.drafted += event.drafted
        self.accepted += event.accepted
        self.draft_seconds += event.draft_seconds
        self.verify_seconds += event.verify_seconds

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.accepted, self.drafted)

    @property
    def tokens_per_step(self) -> float:
        return tokens_per_step(self.step_tokens, self.steps)
