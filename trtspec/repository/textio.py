"""Tokenizer helpers of the emitted Python-backend models (testable without Triton): loading the tokenizer,
encoding prompts and the bounds that request checks use.

Turning ids into text (streaming detokenization, stop strings, and why the served text is exact) lives in
trtspec/runtime/detok.py, shared with the engine; its names are re-exported here for the models' callers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trtspec.artifacts.tokenizer import load_tokenizer  # noqa: F401 (re-exported)
from trtspec.runtime.detok import ContextTracker, boundary_tokens, text_delta  # noqa: F401 (re-exported)


def encode(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))


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
