"""Tokenizer helpers shared by the emitted Python-backend models (and testable without Triton).

Streaming detokenization, and why it is correct
-----------------------------------------------
The generation model (`tensorrt_llm`) sends, per response, the token ids accepted since the
previous response (`output_ids`, the per-step delta) plus a few ids before them (`context_ids`).
The `postprocessing` model, which is stateless and may run several instances, turns that into the
text added since the previous response:

    before = hold(decode(context))
    after  = decode(context + delta)            (hold(...) too unless this is the final response)
    text   = after[len(before):]

`hold` drops a trailing run of U+FFFD: byte-level BPE (and SentencePiece byte fallback) can split a
multi-byte UTF-8 character over several tokens, and a decode that ends inside a character ends in
U+FFFD. Those bytes are held back until the character is complete (or the request ends, when
whatever is left is shown as it decodes).

For `text` to be exactly what the previous responses did not show, the context must start on a
character boundary whose left side was already shown in full. The generation model keeps, per
request, the index of the last *boundary token* before the previous delta (`ContextTracker`): a
token that decodes on its own to non-empty text without U+FFFD. Such a token starts with a
complete character, so (a) decoding from it gives the same text as the full decode from there on,
and (b) everything a previous response held back lies after its first character, inside the
context. So the concatenation of all responses equals `decode(all generated tokens)` and a
character is never split or repeated; the context is usually one token, and never longer than the
run of non-boundary tokens (byte fragments, special tokens) before the delta. Without any boundary
token the context is the whole output, which is still exact.

Stop strings: the engine stops once the text contains one and trims the text at its start. While
streaming, a tail of the text that could still grow into a stop string is held back too (like an
incomplete character), and the final response carries `stop_trim`, the characters to drop from the
end of the decoded text; so the streamed text equals the engine's final text. The held tail may
reach back past the last boundary token, so for requests with stop strings the generation model
sends the whole output as context (one decode per step, as the engine's stop check does anyway).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPLACEMENT = "\ufffd"


def load_tokenizer(path: str | Path):
    """The HF fast tokenizer of a checkpoint/tokenizer dir (what the runtime loads too)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), use_fast=True)


def encode(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    if len(ids) == 0:
        return ""
    return tokenizer.decode(list(ids), skip_special_tokens=True)  # as the engine decodes


def max_token_bytes(tokenizer: Any) -> int:
    """An upper bound of the UTF-8 bytes one token stands for: the longest token string's UTF-8 length
    (exact for SentencePiece pieces, at most 2x for byte-level BPE, whose characters stand for one byte)."""
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return max((len(p.encode("utf-8")) for p in pieces if isinstance(p, str)), default=1)


def vocab_bound(tokenizer: Any) -> int:
    """Token ids are valid below this: the tokenizer's size or the model's (padded) vocab_size in the
    config.json beside it, whichever is larger (ids past the tokenizer decode to nothing)."""
    size = len(tokenizer)
    config = Path(getattr(tokenizer, "name_or_path", "") or ".") / "config.json"
    try:
        size = max(size, int(json.loads(config.read_text(encoding="utf-8")).get("vocab_size") or 0))
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    return size


def hold(text: str) -> str:
    """`text` without a trailing run of U+FFFD (an incomplete character, shown once complete)."""
    return text.rstrip(REPLACEMENT)


def hold_stop(text: str, stop: Sequence[str]) -> str:
    """`text` without its longest tail that is the beginning (not all) of a stop string."""
    held = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:n]):
                held = n
                break
    return text[:len(text) - held]


def shown(text: str, stop: Sequence[str] = ()) -> str:
    """What a non-final response may show of `text`: no incomplete character, no partial stop string."""
    return hold_stop(hold(text), stop)


def text_delta(tokenizer: Any, context: Sequence[int], delta: Sequence[int], final: bool, trim: int = 0,
               stop: Sequence[str] = ()) -> str:
    """The text that `delta` adds after `context` (see the module docstring); a final response
    drops its last `trim` characters first (a stop string and what follows it)."""
    before = shown(decode(tokenizer, context), stop) if len(context) else ""
    after = decode(tokenizer, list(context) + list(delta))
    if not final:
        after = shown(after, stop)
    elif trim > 0:
        after = after[:max(0, len(after) - trim)]
        if len(after) <= len(before):
            return ""
    if after.startswith(before):
        return after[len(before):]
    # A decoder that rewrites earlier text (not byte-level BPE nor SentencePiece): show the part
    # after the first difference rather than repeat text.
    return after[len(os.path.commonprefix([before, after])):]


def boundary_tokens(tokenizer: Any) -> bytearray:
    """A 0/1 table over token ids: 1 where the token alone decodes to non-empty text with no U+FFFD."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))], skip_special_tokens=True)
    return bytearray(1 if text and REPLACEMENT not in text else 0 for text in texts)


class ContextTracker:
    """Per-request state in the generation model: the generated ids and the detokenization context.

    `push(new_ids)` returns `(context, delta)` to send: `context` runs from the last boundary token
    before `delta` (or from the first generated token when there is none)."""

    def __init__(self, boundary: bytearray | None):
        self.boundary = boundary
        self.tokens: list[int] = []
        self.start = 0          # index of the context start for the next push

    def push(self, new_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        context = self.tokens[self.start:]
        delta = [int(t) for t in new_ids]
        if self.boundary is not None:
            for i, t in enumerate(delta, len(self.tokens)):
                if 0 <= t < len(self.boundary) and self.boundary[t]:
                    self.start = i
        self.tokens.extend(delta)
        return context, delta
