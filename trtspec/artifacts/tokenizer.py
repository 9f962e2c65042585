"""Tokenizers: loading a checkpoint's fast tokenizer, the fingerprint that tells two apart, and chat prompts
(the tokenizer's chat template, shared by `generate --chat` and the served `messages` input).

Draft and target must tokenize alike for a draft's tokens to mean anything to the target: `fingerprint`
hashes what decides the ids (vocabulary, merges, model type, added tokens) and nothing cosmetic, from
`tokenizer.json` alone, so the pair check needs neither transformers nor torch.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from trtspec.artifacts.fs import read_json_object
from trtspec.errors import GenerationError, ModelError, TrtspecError

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


def _essence(tok_dir: Path) -> dict[str, Any] | None:
    """What decides a tokenizer's ids: vocabulary, merges, model type, added (special) tokens; None without one."""
    path = Path(tok_dir) / TOKENIZER_JSON
    if not path.is_file():
        return None
    data = read_json_object(path, "tokenizer")
    model = data.get("model")
    model = model if isinstance(model, dict) else {}
    added = data.get("added_tokens")
    return {"vocab": model.get("vocab"), "merges": model.get("merges"), "type": model.get("type"),
            "added": [(t.get("id"), t.get("content")) for t in (added if isinstance(added, list) else [])
                      if isinstance(t, dict)]}


def fingerprint(tok_dir: Path) -> str | None:
    """sha256 of the tokenizer's vocabulary + merges + special tokens (None if no tokenizer.json)."""
    essence = _essence(tok_dir)
    if essence is None:
        return None
    return hashlib.sha256(json.dumps(essence, sort_keys=True).encode()).hexdigest()


def difference(tok_dir: Path, ref_dir: Path, ref_name: str = "the target's") -> str:
    """How `tok_dir`'s tokenizer differs from `ref_dir`'s, in words ("" when they tokenize alike or one has
    no tokenizer.json): the first of model type, vocabulary, merges and special tokens that differs."""
    a, b = _essence(tok_dir), _essence(ref_dir)
    if a is None or b is None or a == b:
        return ""
    if a["type"] != b["type"]:
        return f"its tokenizer model is {a['type']}, {ref_name} is {b['type']}"
    va, vb = a["vocab"] if isinstance(a["vocab"], dict) else {}, b["vocab"] if isinstance(b["vocab"], dict) else {}
    if va != vb:
        if len(va) != len(vb):
            return f"its vocabulary has {len(va)} entries, {ref_name} {len(vb)}"
        token = next(k for k in va if vb.get(k) != va[k])
        if token not in vb:
            return f"its vocabulary differs (its token {token!r}, id {va[token]}, is not in {ref_name})"
        return f"its vocabulary differs (token {token!r} is id {va[token]}, in {ref_name} id {vb[token]})"
    if a["merges"] != b["merges"]:
        return "its merges differ"
    sa, sb = dict(a["added"]), dict(b["added"])
    for i in sorted(set(sa) | set(sb), key=lambda x: (x is None, x if isinstance(x, int) else 0)):
        if sa.get(i) != sb.get(i):
            return f"its special tokens differ: id {i} is {sa.get(i)!r}, in {ref_name} {sb.get(i)!r}"
    return "its special tokens differ"


# ------------------------------------------------------------------------------------------------- chat

CHAT_ROLES = ("system", "user", "assistant", "tool")
MAX_MESSAGES = 256


def chat_messages(value: Any, error: type[TrtspecError] = GenerationError) -> list[dict[str, str]]:
    """A chat as the tokenizer's template takes it: a JSON array (text or parsed) of {"role", "content"}
    objects, roles among CHAT_ROLES, contents strings. Anything else is one `error` saying what is wrong."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise error(f"messages: not JSON ({exc})", hint='send [{"role": "user", "content": "..."}]') from None
    if not isinstance(value, list) or not value:
        raise error("messages: must be a non-empty JSON array of {\"role\", \"content\"} objects",
                    hint='send [{"role": "user", "content": "..."}]')
    if len(value) > MAX_MESSAGES:
        raise error(f"messages: {len(value)} messages, more than {MAX_MESSAGES}")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or m.get("role") not in CHAT_ROLES:
            raise error(f"messages[{i}]: must be {{\"role\": one of {', '.join(CHAT_ROLES)}, \"content\": a string}}")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def render_chat(tokenizer: Any, messages: list[dict[str, str]], error: type[TrtspecError] = GenerationError) -> str:
    """The prompt text of a chat: the tokenizer's chat template with the generation prompt (the assistant's
    turn opened). Encode it without adding special tokens: the template writes them (a BOS added again
    would be a second one)."""
    if not getattr(tokenizer, "chat_template", None):
        raise error("this model's tokenizer has no chat template",
                    hint="send plain text instead, or use a checkpoint whose tokenizer_config.json has chat_template")
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # the template's own checks (jinja raise_exception: roles must alternate, ...)
        raise error(f"messages: the chat template refused them: {' '.join(str(exc).split())[:200]}") from None


def chat_prompt_ids(tokenizer: Any, messages: list[dict[str, str]] | str) -> list[int]:
    """The prompt ids of a chat (a user message when `messages` is a string), as the served preprocessing
    makes them: the rendered template, encoded without adding special tokens."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    return list(tokenizer.encode(render_chat(tokenizer, chat_messages(messages)), add_special_tokens=False))
