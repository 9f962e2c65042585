"""Training data: the Python standard library as a corpus, its byte-level BPE tokenizer, token windows, and
the held-out prompts benchmarks and tests decode from.

Split rule: the interpreter's stdlib `*.py` (tests and data-only packages excluded), sorted by relative path;
file i is held out when i % 25 == 12 (about 4 %). The tokenizer is byte-level BPE with vocab 2048 and one
special token `<|endoftext|>` (id 0) serving as bos/eos/pad; no token is added on encode, and
`decode(encode(s)) == s` for any text.
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from trtspec.artifacts import manifest
from trtspec.artifacts.fs import read_json, write_json
from trtspec.artifacts.tokenizer import load_tokenizer_json
from trtspec.errors import ModelError

EOT = "<|endoftext|>"
VOCAB_SIZE = 2048
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DEFAULT_MODELS_DIR = Path(__file__).resolve().parents[2] / "examples" / "models"
HELDOUT_EVERY = 25  # file i (in sorted order) is held out when i % 25 == HELDOUT_OFFSET  (4 %)
HELDOUT_OFFSET = 12
EXCLUDED_DIRS = ("site-packages", "dist-packages", "encodings", "pydoc_data", "__pycache__")


@dataclass(frozen=True)
class Corpus:
    root: Path
    train_files: tuple[str, ...]  # paths relative to root, posix, sorted
    heldout_files: tuple[str, ...]

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8")


def _is_test_path(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in ("test", "tests") or p.startswith(("test_", "idle_test")) for p in parts[:-1])


def stdlib_corpus(root: Path | None = None, max_files: int | None = None,
                  max_file_bytes: int | None = None) -> Corpus:
    """The interpreter's stdlib *.py split by file (see the module docstring). `max_files` keeps an evenly
    spaced subset (quick mode), `max_file_bytes` skips big files."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise ModelError(f"Python stdlib not found at {root}", hint="run with a regular CPython install")
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if _is_test_path(rel) or any(p in EXCLUDED_DIRS for p in rel.split("/")[:-1]):
            continue
        if max_file_bytes and path.stat().st_size > max_file_bytes:
            continue
        try:
            path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        files.append(rel)
    files.sort()
    if max_files and len(files) > max_files:
        stride = len(files) / max_files
        files = [files[int(i * stride)] for i in range(max_files)]
    if len(files) < HELDOUT_EVERY:
        raise ModelError(f"only {len(files)} usable .py files under {root}", hint="need at least 25")
    held = tuple(f for i, f in enumerate(files) if i % HELDOUT_EVERY == HELDOUT_OFFSET)
    train = tuple(f for i, f in enumerate(files) if i % HELDOUT_EVERY != HELDOUT_OFFSET)
    return Corpus(root, train, held)


def train_tokenizer(texts: Sequence[str], vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE (GPT-2 pre-tokenizer, no prefix space) with `<|endoftext|>` as id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def save_tokenizer(tok, out: Path) -> None:
    """Save in HF format (tokenizer.json, tokenizer_config.json, special_tokens_map.json)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT,
        clean_up_tokenization_spaces=False, model_max_length=1024,
    )
    fast.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    cfg = read_json(cfg_path) or {}
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # readable by transformers 4.x and 5.x
    cfg["add_bos_token"] = False
    cfg["add_eos_token"] = False
    write_json(cfg_path, cfg)
    write_json(out / "special_tokens_map.json", {"bos_token": EOT, "eos_token": EOT, "pad_token": EOT,
                                                 "unk_token": EOT})


def encode_files(tok, texts: Sequence[str]) -> Tensor:
    """One int64 stream: each file's tokens followed by `<|endoftext|>`."""
    eot = tok.token_to_id(EOT)
    out: list[int] = []
    for enc in tok.encode_batch(list(texts)):
        out.extend(enc.ids)
        out.append(eot)
    return torch.tensor(out, dtype=torch.long)


def windows(stream: Tensor, starts: Tensor, length: int) -> Tensor:
    return torch.stack([stream[s: s + length] for s in starts.tolist()])


def eval_windows(stream: Tensor, n: int, seq_len: int) -> Tensor:
    """n evenly spaced windows of seq_len + 1 tokens (inputs and their next-token labels)."""
    n = min(n, (len(stream) - 1) // (seq_len + 1))
    stride = (len(stream) - 1) // n
    return windows(stream, torch.arange(n) * stride, seq_len + 1)


# --------------------------------------------------------------------------------------------- prompts


def snippets(tok, corpus_root: Path, files: Sequence[str], n: int, prompt_tokens: int, seed: int) -> list[str]:
    """n deterministic snippets of exactly prompt_tokens tokens, each starting at a line start
    and round-tripping through the tokenizer; files are taken round-robin in a seeded order."""
    rng = random.Random(seed)
    order = list(files)
    rng.shuffle(order)
    encoded: dict[str, tuple[str, list[int], list[int]] | None] = {}
    out: list[str] = []
    attempts = 0
    while len(out) < n and attempts < 50 * n + 100:
        rel = order[attempts % len(order)]
        attempts += 1
        if rel not in encoded:
            path = corpus_root / rel
            if not path.is_file():
                encoded[rel] = None
                continue
            text = path.read_text(encoding="utf-8")
            enc = tok.encode(text)
            starts = [i for i, (a, _) in enumerate(enc.offsets)
                      if (a == 0 or text[a - 1] == "\n") and text[a: a + 1] not in ("\n", "")
                      and i + 2 * prompt_tokens < len(enc.ids)]
            encoded[rel] = (text, enc.ids, starts)
        entry = encoded[rel]
        if entry is None:
            continue
        text, ids, line_starts = entry
        if not line_starts:
            continue
        start = rng.choice(line_starts)
        piece = tok.decode(ids[start: start + prompt_tokens])
        if (not piece.strip() or "\ufffd" in piece or piece in out
                or tok.encode(piece).ids != ids[start: start + prompt_tokens]):
            continue
        out.append(piece)
    if len(out) < n:
        raise ModelError(f"could only cut {len(out)} of {n} held-out prompts of {prompt_tokens} tokens",
                         hint="ask for fewer or shorter prompts")
    return out


def heldout_prompts(n: int, prompt_tokens: int = 64, seed: int = 0, *,
                    models_dir: str | Path | None = None) -> list[str]:
    """n deterministic code snippets from the demo family's held-out stdlib files.

    Each snippet starts at a line start and encodes to exactly `prompt_tokens` tokens with the
    family's tokenizer (no special tokens). Held-out files are read from `models_dir`'s
    MANIFEST.json (default examples/models) and resolved against this interpreter's stdlib;
    without a manifest the split rule of `stdlib_corpus` is used."""
    directory = Path(models_dir) if models_dir is not None else DEFAULT_MODELS_DIR
    if n < 1 or prompt_tokens < 1:
        raise ModelError("heldout_prompts needs n >= 1 and prompt_tokens >= 1")
    tok = load_tokenizer_json(directory / "target", hint="run `trtspec models train-demo` first")
    root = Path(sysconfig.get_paths()["stdlib"])
    family = manifest.read(directory / manifest.FILE_NAMES[manifest.DEMO], manifest.DEMO)
    files = (family["inputs"]["corpus"]["heldout_files"] if family is not None
             else list(stdlib_corpus(root).heldout_files))
    return snippets(tok, root, files, n, prompt_tokens, seed)
