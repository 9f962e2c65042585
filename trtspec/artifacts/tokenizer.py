"""Tokenizers: loading a checkpoint's fast tokenizer, and the fingerprint that tells two apart.

Draft and target must tokenize alike for a draft's tokens to mean anything to the target: `fingerprint`
hashes what decides the ids (vocabulary, merges, model type, added tokens) and nothing cosmetic, from
`tokenizer.json` alone, so the pair check needs neither transformers nor torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from trtspec.artifacts.fs import read_json_object
from trtspec.errors import ModelError

TOKENIZER_JSON = "tokenizer.json"


def load_tokenizer(path: str | Path):
    """The HF fast tokenizer of a checkpoint/tokenizer dir (what the runtime and the served models use)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), use_fast=True)


def load_tokenizer_json(tok_dir: str | Path, hint: str = "point it at a dir with an HF fast tokenizer"):
    """The `tokenizers.Tokenizer` of a dir's tokenizer.json (ids with offsets, no transformers needed)."""
    from tokenizers import Tokenizer

    path = Path(tok_dir) / TOKENIZER_JSON
    if not path.is_file():
        raise ModelError(f"no tokenizer at {path}", hint=hint)
    return Tokenizer.from_file(str(path))


def fingerprint(tok_dir: Path) -> str | None:
    """sha256 of the tokenizer's vocabulary + merges + special tokens (None if no tokenizer.json)."""
    path = Path(tok_dir) / TOKENIZER_JSON
    if not path.is_file():
        return None
    data = read_json_object(path, "tokenizer")
    model = data.get("model")
    model = model if isinstance(model, dict) else {}
    added = data.get("added_tokens")
    essence = {"vocab": model.get("vocab"), "merges": model.get("merges"), "type": model.get("type"),
               "added": [(t.get("id"), t.get("content")) for t in (added if isinstance(added, list) else [])
                         if isinstance(t, dict)]}
    return hashlib.sha256(json.dumps(essence, sort_keys=True).encode()).hexdigest()
