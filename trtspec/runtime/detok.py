"""Token ids -> text, and stop strings: the one place for both, shared by the engine (streamed text, stop
detection, trimming) and the served models (the stateless `postprocessing`, the generation model's stop_trim).

The rules
---------
- decode: `tokenizer.decode(ids, skip_special_tokens=True)` of the whole output is THE text; everything
  shown on the way must add up to it.
- hold: while streaming, a trailing run of U+FFFD is held back: byte-level BPE (and SentencePiece byte
  fallback) can split a multi-byte UTF-8 character over several tokens, and a decode that ends inside a
  character ends in U+FFFD. It is shown once complete (or when the request ends, as it decodes then).
- stop strings: generation stops once the text contains one; the text is cut where the first one starts.
  While streaming, a tail of the text that could still grow into a stop string is held back too (it may
  be cut), so the streamed text equals the final text. `shown` applies both holds.

In the engine (`TextStream`)
----------------------------
Per request, tokenizers' `DecodeStream` extends the text incrementally (one short decode per step instead
of the whole output again); whenever it holds tokens back (an incomplete character, a skipped special
token) the text is decoded in full, so the text the stop check sees is always exactly decode(ids).
Tokenizers it cannot mirror (no fast backend; transformers' clean-up pass) decode in full every time.

In the served models (stateless postprocessing), and why it is exact
-------------------------------------------------------------------
The generation model (`tensorrt_llm`) sends, per response, the token ids accepted since the
previous response (`output_ids`, the per-step delta) plus a few ids before them (`context_ids`).
The `postprocessing` model, which is stateless and may run several instances, turns that into the
text added since the previous response:

    before = shown(decode(context))
    after  = decode(context + delta)            (shown(...) too unless this is the final response)
    text   = after[len(before):]

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

With stop strings the final response carries `stop_trim`, the characters to drop from the end of the
decoded text (`find_stop` on the whole output, as the engine cut it). The held tail may reach back past
the last boundary token, so for requests with stop strings the generation model sends the whole output
as context.

No torch here: the served pre/postprocessing models import this module.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

REPLACEMENT = "\ufffd"


def decode(tokenizer: Any, ids: Sequence[int]) -> str:
    if len(ids) == 0:
        return ""
    return tokenizer.decode(list(ids), skip_special_tokens=True)


def hold(text: str) -> str:
    """`text` without a trailing run of U+FFFD (an incomplete character, shown once complete)."""
    return text.rstrip(REPLACEMENT)


def stop_prefix(text: str, stops: Sequence[str]) -> int:
    """Length of the longest end of `text` that is a proper prefix of a stop string (held back while
    streaming: the next tokens may complete the stop string, which is never shown)."""
    n = 0
    for s in stops:
        for m in range(min(len(s) - 1, len(text)), n, -1):
            if text.endswith(s[:m]):
                n = m
                break
    return n


def shown(text: str, stops: Sequence[str] = ()) -> str:
    """What a non-final response may show of `text`: no incomplete character, no partial stop string."""
    text = hold(text)
    return text[:len(text) - stop_prefix(text, stops)]


def find_stop(text: str, stops: Sequence[str], start: int = 0) -> int | None:
    """Where the first stop string in `text[start:]` begins (None: none there)."""
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None


# ------------------------------------------------------------------------------------------------ engine

class TextStream:
    """One request's output text as its tokens arrive (see the module docstring)."""

    def __init__(self, tokenizer: Any, stops: Sequence[str] = ()):
        self.tokenizer, self.stops = tokenizer, tuple(stops)
        self.ids: list[int] = []
        self.view = ""                 # decode(self.ids), always
        self.stop_at: int | None = None
        self.sent = 0                  # characters handed out by delta()
        self._longest = max(map(len, self.stops), default=0)
        self._released = ""            # the DecodeStream's chunks so far: a prefix no later token changes
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._stream = None
        if self._backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
            from tokenizers.decoders import DecodeStream

            self._stream = DecodeStream(skip_special_tokens=True)

    def push(self, ids: list[int]) -> bool:
        """Add tokens; True if the text now holds a stop string (`stop_at`: where the first one starts).
        With stop strings, push one token at a time: generation ends at the token that completes one."""
        self.ids.extend(ids)
        start = max(0, len(self._released) - self._longest + 1) if self._stream is not None else 0
        chunk = None
        if self._stream is not None:
            try:
                chunk = self._stream.step(self._backend, ids)
            except Exception:  # a decoder that rewrote its prefix: decode in full from now on
                self._stream = None
        if chunk is not None:
            self._released += chunk
            self.view = self._released
        else:
            self.view = decode(self.tokenizer, self.ids)
        if self.stops:
            self.stop_at = find_stop(self.view, self.stops, start)
        return self.stop_at is not None

    @property
    def text(self) -> str:
        """The text so far, cut at the stop string if one was hit (the final text once the request ends)."""
        return self.view if self.stop_at is None else self.view[:self.stop_at]

    def delta(self, final: bool) -> str:
        """The text not handed out yet: all of it when `final`, else only what `shown` allows."""
        text = self.text if final else shown(self.text, self.stops)
        new, self.sent = text[self.sent:], max(self.sent, len(text))
        return new


# ------------------------------------------------------------------------------------- served models

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


def stop_trim(tokenizer: Any, ids: Sequence[int], stops: Sequence[str]) -> int:
    """Characters after the start of the first stop string in decode(ids) (what the engine cut)."""
    text = decode(tokenizer, ids)
    at = find_stop(text, stops)
    return 0 if at is None else len(text) - at


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
