"""Incremental detokenization for streaming.

Byte-level BPE tokens can end in the middle of a UTF-8 character; decoding each step's tokens on
their own would print replacement characters. `TextStream` decodes everything so far and emits only
the new, complete text, holding back a trailing partial character until the next token completes it.
"""

from __future__ import annotations

from typing import Protocol

_REPLACEMENT = "\ufffd"


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class TextStream:
    def __init__(self, tokenizer: _Decoder, skip_special_tokens: bool = True):
        self._tok = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = []
        self._emitted = 0  # characters of the decoded text already returned

    @property
    def text(self) -> str:
        return self._tok.decode(self._ids, skip_special_tokens=self._skip)

    def push(self, ids: list[int]) -> str:
        """Add tokens; return the text they complete (may be empty)."""
        self._ids.extend(int(i) for i in ids)
        text = self.text
        end = len(text)
        while end > self._emitted and text[end - 1] == _REPLACEMENT:
            end -= 1
        delta = text[self._emitted:end]
        self._emitted = end
        return delta

    def flush(self) -> str:
        """The rest of the text at the end of a stream, partial characters included."""
        text = self.text
        delta = text[self._emitted:]
        self._emitted = len(text)
        return delta
