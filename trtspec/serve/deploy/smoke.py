"""The smoke test of a deploy: one greedy request with the deployment's K and one without speculation."""

from __future__ import annotations

import dataclasses
from typing import Any

from trtspec.errors import TrtspecError
from trtspec.serve.deploy.loading import _StepFailed

DEFAULT_SMOKE_PROMPT = "def main():\n    "


@dataclasses.dataclass
class SmokeResult:
    prompt: str
    text: str                          # greedy, the deployment's K
    text_plain: str                    # greedy, num_draft_tokens = 0
    identical: bool
    new_tokens: int
    ttft_seconds: float | None
    seconds: float
    acceptance_rate: float
    tokens_per_step: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def smoke_test(grpc_url: str, prompt: str, *, model: str, max_tokens: int = 32, timeout: float = 120.0,
               grpc_options=None) -> SmokeResult:
    """Greedy with the deployment's K and with no speculation: both non-empty and identical
    (`grpc_options`: TLS and headers, trtspec.client.remote.GrpcOptions)."""
    from trtspec.client.remote import generate_remote

    try:
        spec_run = generate_remote(grpc_url, prompt, max_tokens=max_tokens, model=model, timeout=timeout,
                                   options=grpc_options)
        plain = generate_remote(grpc_url, prompt, max_tokens=max_tokens, model=model, num_draft_tokens=0,
                                timeout=timeout, options=grpc_options)
    except TrtspecError as exc:
        raise _StepFailed("smoke test", f"smoke request to {grpc_url} failed: {exc.message}") from None
    result = SmokeResult(prompt=prompt, text=spec_run.text, text_plain=plain.text,
                         identical=spec_run.text == plain.text, new_tokens=spec_run.new_tokens,
                         ttft_seconds=spec_run.ttft_seconds, seconds=spec_run.seconds,
                         acceptance_rate=spec_run.acceptance_rate, tokens_per_step=spec_run.tokens_per_step)
    if not spec_run.text or not plain.text:
        raise _StepFailed("smoke test", "smoke test returned empty text")
    if not result.identical:
        raise _StepFailed("smoke test", f"speculative and plain greedy outputs differ "
                                        f"({spec_run.text[:40]!r} vs {plain.text[:40]!r})")
    return result
