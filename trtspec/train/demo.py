"""The shipped demo model family: a small Llama target trained here on the Python standard library, and its
three drafters trained by `trtspec train` (trtspec.train.drafters), with fixed steps and seed 0 (on two CPU
cores: the target ~35 minutes, a drafter step ~0.8 s). `trtspec models train-demo` drives `train_family`;
`--target DIR` trains only the drafters, against an existing family target (copied byte-identical into the
new family).

Layout written by `train_family(out)` (head layouts: trtspec.artifacts.heads)::

    out/
      MANIFEST.json        an artifacts.manifest (kind "demo-family"): inputs (the corpus split), outputs
                           (sha256 + size of every file), seeds, steps, losses, each drafter's trainer record
                           (`trtspec train`'s manifest: recipe, data, budget, losses) and measured acceptance
      target/              LlamaForCausalLM (config.json, model.safetensors, generation_config.json,
                           tokenizer.json, tokenizer_config.json, special_tokens_map.json)
      draft/               a small LlamaForCausalLM distilled from the target, same tokenizer files
      medusa/              medusa_lm_head.safetensors + config.json  (TensorRT-LLM Medusa layout)
      eagle/               model.safetensors + config.json           (EAGLE-1 layout)

All weights are stored in float16. Target and draft are transformers' LlamaForCausalLM, the EAGLE head is
transformers' LlamaDecoderLayer (train/modules.py); the only Llama trtspec implements itself is the runtime's.

Recipe (demo_config.py): the tokenizer (byte-level BPE) and the target (next-token CE on random windows;
demo_target.py) are trained here. The drafters are `train_drafter("draft-model" | "medusa" | "eagle")` on
plain text: the corpus' training files in a seeded order, one {"text"} row a file, cut into `seq_len`-token
samples (the first `teacher_seqs` of them), the draft vocabulary the whole vocabulary; the three share one
work dir, so one frozen-target pass (the teacher's logits and the final hidden states) serves them all.
Acceptance is measured by the runtime itself (SpecEngine, greedy, fixed K; train/acceptance.py) on held-out
corpus snippets, against its own plain decoding.
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from trtspec.artifacts import manifest
from trtspec.artifacts.fs import atomic_dir
from trtspec.artifacts.hf import CONFIG
from trtspec.errors import ModelError
from trtspec.train import data
from trtspec.train.acceptance import measure_family
from trtspec.train.demo_config import DRAFTERS, FamilyConfig
from trtspec.train.demo_target import fp16_roundtrip, heldout_loss, load_llama, save_llama, train_lm
from trtspec.train.modules import llama, n_params
from trtspec.train.recipe import Reporter, silent

MANIFEST_FORMAT = 3  # 2: drafters by demo.py's own recipes; 1: before the common manifest shape (still read)
SERVED = {"draft-model": {"draft": "draft"}, "medusa": {"heads": "medusa"}, "eagle": {"heads": "eagle"}}  # spec keys
PLANS = {"draft-model": (2, 4, 8), "medusa": (4,), "eagle": (4,)}  # the K each method is measured at
MEASURED = {"draft-model": "draft", "medusa": "medusa", "eagle": "eagle"}  # method -> the member it measures


def file_table(root: Path) -> dict[str, dict]:
    """The outputs a family's MANIFEST records: every file but the manifest, less any sub-directory that is an
    artifact of its own (carries its own manifest, as `make smollm2`'s import beside the family does)."""
    own = {d.name for d in Path(root).iterdir() if d.is_dir()
           and any((d / name).is_file() for name in manifest.FILE_NAMES.values())}
    return {rel: entry for rel, entry in manifest.file_table(root).items() if rel.split("/", 1)[0] not in own}


def _r(x: float) -> float:
    return round(float(x), 4)


def train_family(out: str | Path, cfg: FamilyConfig = FamilyConfig(), report: Reporter = silent,
                 force: bool = False, log: Callable[[str], None] = lambda s: None,
                 target: str | Path | None = None) -> dict:
    """Train tokenizer, target, draft, Medusa and EAGLE heads; write them atomically to `out`. With `target`
    (an existing family's target dir) train only the drafters against it: it is copied into `out` as it is,
    its tokenizer kept.

    Training happens in a temporary directory next to `out`, which replaces it at the end (artifacts.fs
    .atomic_dir; the drafters' work dir lives inside it and goes with it); an existing non-empty `out` is
    replaced only with force=True. Returns the manifest."""
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise ModelError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ModelError(f"{out} is not empty", hint="pass --force to replace it")
    source = _family_target(Path(target)) if target is not None else None
    torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    with atomic_dir(out) as tmp:
        inputs, fields = _train_into(tmp, cfg, report, log, source)
        record = manifest.new(manifest.DEMO, MANIFEST_FORMAT, inputs=inputs, outputs=file_table(tmp), **fields,
                              wall_s_total=round(time.perf_counter() - t_start, 1))
        manifest.write(tmp / manifest.FILE_NAMES[manifest.DEMO], record)
    return record


def _family_target(src: Path) -> Path:
    """`--target DIR`: a family target (a Llama checkpoint with the family's tokenizer files), resolved."""
    src = src.resolve()
    missing = [n for n in (CONFIG, "model.safetensors", *data.TOKENIZER_FILES) if not (src / n).is_file()]
    if not src.is_dir() or missing:
        raise ModelError(f"--target {src} is not a demo-family target (missing: {', '.join(missing) or 'the dir'})",
                         hint="give the target/ dir of a family written by `trtspec models train-demo`")
    return src


def _reused_target(src: Path, dst: Path) -> dict:
    """Copy a family target into `dst` byte for byte; its MANIFEST entry is the source family's when that
    family's manifest records exactly these files, else only where it came from."""
    dst.mkdir()
    for f in sorted(src.iterdir()):
        if f.is_file():
            shutil.copyfile(f, dst / f.name)
    entry: dict = {"path": "target", "reused_from": str(src)}
    family = manifest.read(src.parent / manifest.FILE_NAMES[manifest.DEMO], manifest.DEMO)
    mine = {f"target/{rel}": e for rel, e in manifest.file_table(dst).items()}
    if family is not None and {k: v for k, v in family["outputs"].items() if k.startswith("target/")} == mine:
        entry.update({k: v for k, v in family["models"]["target"].items() if k not in ("path", "loss")})
    return entry


def _corpus_text(path: Path, texts: Sequence[str], seed: int) -> Path:
    """The drafters' data: the training files in a seeded order, one {"text"} row a file (the trainer cuts
    the stream into samples and takes the first `teacher_seqs`: a random subset of whole files)."""
    order = list(range(len(texts)))
    random.Random(seed).shuffle(order)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i in order:
            f.write(json.dumps({"text": texts[i]}) + "\n")
    return path


def _trainer_record(m: dict, text: Path) -> dict:
    """A drafter's trtspec.train.json as the family's MANIFEST keeps it: not its outputs (the family's table
    has them) nor its held-out note (the family measures on its own held-out snippets); paths the family's."""
    rec = {k: v for k, v in m.items() if k not in ("outputs", "versions", "created", "acceptance")}
    rec["inputs"] = {"target": {**m["inputs"]["target"], "path": "target"},
                     "data": {**m["inputs"]["data"], "source": text.name}}
    rec["recipe"] = {**m["recipe"], "data": text.name}
    return rec


def _as_phase(report: Reporter, name: str) -> Reporter:
    """The trainer's "train" steps reported as the member's own phase (one progress bar each)."""
    return lambda phase, *a: report(name if phase == "train" else phase, *a)


@dataclass(frozen=True)
class _Streams:
    """The corpus as token streams, and the windows the losses are evaluated on."""

    train: Tensor           # [train_tokens] the training files, encoded one after another
    held: Tensor            # [heldout_tokens] the held-out files
    train_eval: Tensor      # [eval_seqs, seq_len + 1] evenly spaced windows of `train`
    held_eval: Tensor       # [eval_seqs, seq_len + 1] of `held`


def _train_into(root: Path, cfg: FamilyConfig, report: Reporter, log: Callable[[str], None],
                source: Path | None = None) -> tuple[dict, dict]:
    """Train and write the family into `root`; returns (the manifest's inputs, its kind-specific fields)."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    corpus = data.stdlib_corpus(max_files=cfg.max_files, max_file_bytes=cfg.max_file_bytes)
    train_texts = [corpus.read(f) for f in corpus.train_files]
    held_texts = [corpus.read(f) for f in corpus.heldout_files]
    models: dict[str, dict] = {}
    tok, tok_dir = _tokenizer(root, train_texts, source, models, log)
    streams = _streams(corpus, tok, train_texts, held_texts, cfg, log)
    _target(root, cfg, streams, tok_dir, gen, models, report, log)
    teacher = _drafters(root, cfg, train_texts, tok.get_vocab_size(), streams, models, report, log)
    prompts = _measure(root, cfg, corpus, tok, models, report, log)
    return _inputs(corpus, streams, source, models), _fields(cfg, source, tok.get_vocab_size(), teacher, prompts,
                                                             models)


def _tokenizer(root: Path, train_texts: Sequence[str], source: Path | None, models: dict, log):
    """(the tokenizer, the scratch dir it was saved to): trained on the training files, or the reused target's
    (the target copied into the family first, its MANIFEST entry into `models`; no scratch dir)."""
    from trtspec.artifacts.tokenizer import load_tokenizer_json

    if source is None:
        tok = data.train_tokenizer(train_texts)
        tok_dir = root / ".tokenizer"
        data.save_tokenizer(tok, tok_dir)
        return tok, tok_dir
    models["target"] = _reused_target(source, root / "target")
    tok = load_tokenizer_json(root / "target")
    log(f"target: reused {source}")
    return tok, None


def _streams(corpus, tok, train_texts: Sequence[str], held_texts: Sequence[str], cfg: FamilyConfig,
             log) -> _Streams:
    train, held = data.encode_files(tok, train_texts), data.encode_files(tok, held_texts)
    log(f"corpus: {len(corpus.train_files)} train files ({len(train):,} tokens), "
        f"{len(corpus.heldout_files)} held out ({len(held):,} tokens)")
    return _Streams(train, held, data.eval_windows(train, cfg.eval_seqs, cfg.seq_len),
                    data.eval_windows(held, cfg.eval_seqs, cfg.seq_len))


def _losses(model, streams: _Streams) -> dict[str, float]:
    return {"train": _r(heldout_loss(model, streams.train_eval)), "heldout": _r(heldout_loss(model, streams.held_eval))}


def _target(root: Path, cfg: FamilyConfig, streams: _Streams, tok_dir: Path | None, gen: torch.Generator,
            models: dict, report: Reporter, log) -> None:
    """Train the target and write it into root/target with the tokenizer saved in `tok_dir` (None: the target
    is reused, and there already); record its losses."""
    T = cfg.seq_len
    if tok_dir is not None:
        target = llama(cfg.target)
        last, wall = train_lm(target, streams.train, cfg.target_stage, T, gen, report)
        fp16_roundtrip(target)
        save_llama(target, cfg.target, root / "target", tok_dir)
        shutil.rmtree(tok_dir)
        models["target"] = {
            "path": "target", "params": n_params(target), "shape": asdict(cfg.target),
            "train": {**asdict(cfg.target_stage), "seq_len": T, "wall_s": round(wall, 1),
                      "tokens_seen": cfg.target_stage.steps * cfg.target_stage.batch * T,
                      "final_train_loss_ema": _r(last)}}
    else:
        target = load_llama(root / "target")
        models["target"].setdefault("params", n_params(target))
    models["target"]["loss"] = _losses(target, streams)
    log(f"target: {models['target']['loss']}")


def _drafters(root: Path, cfg: FamilyConfig, train_texts: Sequence[str], vocab: int, streams: _Streams,
              models: dict, report: Reporter, log) -> dict:
    """`trtspec train` of each drafter on the corpus' training text, one work dir (one teacher pass) for all;
    their records into `models`. Returns what the teacher pass was."""
    from trtspec.train.drafters import train_drafter

    work = root / ".work"
    text = _corpus_text(work / "corpus.jsonl", train_texts, cfg.seed)
    for name, kind in DRAFTERS.items():
        m = train_drafter(kind, root / "target", root / name, cfg.drafter_config(name, text, vocab), work=work,
                          report=_as_phase(report, name), log=log, target_name="../target")
        (root / name / manifest.FILE_NAMES[manifest.TRAIN]).unlink()  # the family's MANIFEST records it
        models[name] = {"path": name, "params": m["params"], "trainer": _trainer_record(m, text)}
        log(f"{name}: {m['budget']['steps_done']} steps in {m['budget']['wall_s']['train']:.0f}s")
    teacher = {"sequences": m["inputs"]["data"]["samples"], "seq_len": cfg.seq_len, "topk": cfg.topk,
               "tokens": m["inputs"]["data"]["tokens"], "draft_vocab_size": m["draft_vocab_size"],
               "wall_s": {k: round(float(v), 1) for k, v in m["budget"]["wall_s"].items()
                          if k in ("data", "features", "hidden")},
               "stored": "the target's top-k logits (fp16) and final hidden states, by trtspec train"}
    shutil.rmtree(work)
    models["draft"]["loss"] = _losses(load_llama(root / "draft"), streams)
    return teacher


def _measure(root: Path, cfg: FamilyConfig, corpus, tok, models: dict, report: Reporter, log) -> int:
    """Acceptance of every drafter (fp32 compute on the fp16 weights) into `models`; returns the prompts."""
    t0 = time.perf_counter()
    prompt_texts = data.snippets(tok, corpus.root, corpus.heldout_files, cfg.accept_prompts,
                                 cfg.accept_prompt_tokens, cfg.seed)
    prompts = [tok.encode(p).ids for p in prompt_texts]
    acceptance = measure_family(root, prompts, cfg.accept_new_tokens, PLANS, SERVED, report)
    for method, name in MEASURED.items():
        models[name]["acceptance"] = acceptance[method]
    log(f"measurement in {time.perf_counter() - t0:.0f}s")
    return len(prompts)


def _inputs(corpus, streams: _Streams, source: Path | None, models: dict) -> dict:
    inputs = {"corpus": {
        "source": "python stdlib *.py (sysconfig stdlib path)",
        "excluded": "test/tests/test_*/idle_test dirs, " + ", ".join(data.EXCLUDED_DIRS),
        "split_rule": f"sorted relative paths; file i held out iff i % {data.HELDOUT_EVERY} == {data.HELDOUT_OFFSET}",
        "train_files": len(corpus.train_files), "train_tokens": len(streams.train),
        "heldout_tokens": len(streams.held), "heldout_files": list(corpus.heldout_files),
    }}
    if source is not None:
        inputs["target"] = {"path": str(source), "family_manifest_matches": "train" in models["target"]}
    return inputs


def _fields(cfg: FamilyConfig, source: Path | None, vocab: int, teacher: dict, prompts: int, models: dict) -> dict:
    flags = (" --quick" if cfg.quick else "") + (" --target" if source is not None else "")
    return {
        "created_by": "trtspec models train-demo" + flags,
        "seed": cfg.seed,
        "config": asdict(cfg),
        "machine": {"cpus": os.cpu_count(), "threads": cfg.threads, "platform": platform.platform()},
        "tokenizer": {"type": "byte-level BPE", "vocab_size": vocab, "special_tokens": [data.EOT],
                      "bos_eos_pad": data.EOT, "files": list(data.TOKENIZER_FILES)},
        "teacher_pass": teacher,
        "measurement": {
            "what": "greedy speculative decoding through trtspec.runtime.SpecEngine (KV cache, fixed K, no EOS "
                    "stop), fp32 compute on the fp16 weights",
            "prompts": prompts, "prompt_tokens": cfg.accept_prompt_tokens, "new_tokens": cfg.accept_new_tokens,
            "prompt_source": "heldout_prompts(n, prompt_tokens, seed)",
            "tau": "new tokens / target forwards (prefill counted)",
            "acceptance_rate": "accepted drafted tokens / drafted tokens",
            "chain": "medusa/eagle candidate = [target's next token, K head guesses]",
        },
        "models": models,
    }
