"""Stage 1 of `trtspec train`, data: the training samples (data.jsonl), each a token list and the length of
its prompt. Prompts (a builtin set, or a .jsonl of {"prompt"} / {"messages"}) are answered by the target
itself through trtspec's runtime (SpecEngine.generate_batch, plain decoding), each a user turn in the chat
template when the tokenizer has one; plain text (a .txt, or a .jsonl of {"text"}) is cut into chunks as it is.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from trtspec.artifacts.fs import digest, read_json, sha256_file, write_json
from trtspec.artifacts.hf import CONFIG
from trtspec.errors import SpecError
from trtspec.train import prompts as builtin
from trtspec.train.recipe import Reporter, TrainConfig


def _read_data(source: str) -> tuple[str, list[Any], list[str]]:
    """(mode "prompts" | "text", training items, held-out prompts) of --data."""
    if source.startswith("builtin:"):
        name = source.split(":", 1)[1]
        if name not in builtin.SETS:
            raise SpecError(f"--data {source}: no such builtin set",
                            hint=f"use builtin:{' or builtin:'.join(builtin.SETS)}")
        train, held = builtin.split(builtin.prompt_set(name))
        return "prompts", train, held
    path = Path(source)
    if not path.is_file():
        raise SpecError(f"--data {source}: no such file",
                        hint="give a .jsonl of prompts or texts, a .txt, or builtin:mix")
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return "text", [text], []
    rows = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise SpecError(f"--data {source}: line {i + 1} is not JSON") from None
        if not isinstance(row, dict) or not any(isinstance(row.get(k), (str, list))
                                                for k in ("prompt", "messages", "text")):
            raise SpecError(f"--data {source}: line {i + 1} has no \"prompt\", \"messages\" or \"text\"")
        rows.append(row)
    if not rows:
        raise SpecError(f"--data {source}: no rows")
    texts = [r["text"] for r in rows if isinstance(r.get("text"), str)]
    if texts and len(texts) == len(rows):
        return "text", texts, []
    items = [r.get("messages") or r.get("prompt") for r in rows]
    train, held = builtin.split(items)
    return "prompts", train, held


def prompt_ids(tok, item) -> list[int]:
    """A prompt (text, or a chat's messages) as token ids: a user turn of the chat template when there is one."""
    from trtspec.artifacts.tokenizer import chat_prompt_ids

    if getattr(tok, "chat_template", None):
        return chat_prompt_ids(tok, item)
    return list(tok(item if isinstance(item, str) else item[-1]["content"])["input_ids"])


def target_engine(target: Path, spec_extra: dict[str, Any], batch: int, max_in: int, max_out: int, device: str,
                  tok):
    """A SpecEngine on the target (torch runtime, float32) with the speculative section `spec_extra`
    (none: plain decoding)."""
    from trtspec import methods
    from trtspec.spec import spec_from_dict

    spec = spec_from_dict({
        "schema": 1, "model": {"name": "train", "target": str(target), "dtype": "float32"},
        "speculative": {"method": "none", **spec_extra},
        "limits": {"max_batch_size": batch, "max_input_len": max_in, "max_output_len": max_out},
        "runtime": {"kind": "torch", "device": device}})
    return methods.engine(spec, tokenizer=tok)


def make_data(work: Path, target: Path, cfg: TrainConfig, tok, report: Reporter, log) -> dict[str, Any]:
    """Stage 1: data.jsonl ({"ids", "prompt_len"} per sample; appended while generating, so resumable). Sample
    i is prompt order[i] of a seeded order answered with its own seed, so a longer run's first N samples are
    a shorter run's: --samples can grow (or shrink) without answering anything again."""
    from trtspec.runtime import SamplingParams

    mode, items, held = _read_data(cfg.data)
    path, meta_path = work / "data.jsonl", work / "data.json"
    key = cfg.data_key(target_id(target))
    meta = read_json(meta_path)
    if meta is None or meta.get("key") != key:
        path.unlink(missing_ok=True)
        meta = {"key": key, "mode": mode}
        write_json(meta_path, meta)
    if path.is_file():  # a run killed mid-line: keep the whole lines
        text = path.read_text()
        if not text.endswith("\n") and text:
            path.write_text(text[: text.rfind("\n") + 1])
    have = path.read_text().count("\n") if path.is_file() else 0
    t0 = time.perf_counter()
    if mode == "text":
        ids = [i for text in items for i in list(tok(text)["input_ids"]) + [_eos(tok)]]
        n = cfg.text_tokens
        chunks = [ids[i:i + n] for i in range(0, len(ids) - 1, n)][: cfg.samples]
        with path.open("w") as f:
            for c in chunks:
                f.write(json.dumps({"ids": c, "prompt_len": 0}) + "\n")
    elif have < cfg.samples:
        order = list(range(len(items)))
        random.Random(cfg.seed).shuffle(order)
        order = [order[i % len(order)] for i in range(cfg.samples)]  # a small set is answered again (sampled)
        prompts = [prompt_ids(tok, items[i]) for i in order]
        max_in = max(len(p) for p in prompts)
        engine = target_engine(target, {}, cfg.gen_batch, max_in, cfg.max_new_tokens, cfg.device, tok)
        try:
            with path.open("a") as f:
                for start in range(have, len(prompts), cfg.gen_batch * 2):
                    chunk = list(range(start, min(len(prompts), start + cfg.gen_batch * 2)))
                    sps = [SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                                          top_p=cfg.top_p, seed=cfg.seed * 1_000_003 + i, num_draft_tokens=0)
                           for i in chunk]
                    results = engine.generate_batch([prompts[i] for i in chunk], sps)
                    for i, r in zip(chunk, results):
                        f.write(json.dumps({"ids": prompts[i] + r.tokens, "prompt_len": len(prompts[i])}) + "\n")
                    f.flush()
                    report("data", chunk[-1] + 1, len(prompts), None)
        finally:
            engine.close()
    meta.update(mode=mode, wall_s=round(meta.get("wall_s", 0) + time.perf_counter() - t0, 1))
    write_json(meta_path, meta)
    samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][: cfg.samples]
    log(f"data: {len(samples)} samples, {sum(len(s['ids']) for s in samples):,} tokens ({mode})")
    return {"mode": mode, "samples": samples, "heldout": held, "wall_s": meta["wall_s"],
            "sha256": digest(samples), "train_items": len(items)}


def _eos(tok) -> int:
    return int(tok.eos_token_id) if getattr(tok, "eos_token_id", None) is not None else 0


def target_id(target: Path) -> dict[str, Any]:
    from trtspec.artifacts.tokenizer import fingerprint

    return {"config_sha256": sha256_file(Path(target) / CONFIG), "tokenizer_sha256": fingerprint(Path(target))}

