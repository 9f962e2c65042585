"""The shipped demo model family: a small Llama target trained here on the Python standard library, and its
three drafters trained by `trtspec train` (trtspec.train.drafters), with fixed steps and seed 0 (on two CPU
cores: the target ~35 minutes, a drafter step ~0.8 s). `trtspec models train-demo` drives `train_family`; `--target DIR` trains only the
drafters, against an existing family target (copied byte-identical into the new family).

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
transformers' LlamaDecoderLayer (train/heads.py); the only Llama trtspec implements itself is the runtime's.

Recipe: the tokenizer (byte-level BPE) and the target (next-token CE on random windows) are trained here.
The drafters are `train_drafter("draft-model" | "medusa" | "eagle")` on plain text: the corpus' training
files in a seeded order, one {"text"} row a file, cut into `seq_len`-token samples (the first `teacher_seqs`
of them), the draft vocabulary the whole vocabulary; the three share one work dir, so one frozen-target pass
(the teacher's logits and the final hidden states) serves them all. Acceptance is measured by the runtime itself (SpecEngine,
greedy, fixed K) on held-out corpus snippets, against its own plain decoding.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import random
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn

from trtspec.artifacts import manifest
from trtspec.artifacts.fs import atomic_dir, read_json, write_json
from trtspec.artifacts.hf import CONFIG, with_legacy_keys
from trtspec.errors import ModelError
from trtspec.train import data
from trtspec.train.heads import Shape, forward, llama, lm_loss, n_params

MANIFEST_FORMAT = 3  # 2: drafters by demo.py's own recipes; 1: before the common manifest shape (still read)

# A step callback: (phase, step, total_steps, loss or None). The CLI turns it into progress bars.
Reporter = Callable[[str, int, int, "float | None"], None]


def _silent(phase: str, step: int, total: int, loss: float | None) -> None:
    pass


def file_table(root: Path) -> dict[str, dict]:
    """The outputs a family's MANIFEST records: every file but the manifest, less any sub-directory that is an
    artifact of its own (carries its own manifest, as `make smollm2`'s import beside the family does)."""
    own = {d.name for d in Path(root).iterdir() if d.is_dir()
           and any((d / name).is_file() for name in manifest.FILE_NAMES.values())}
    return {rel: entry for rel, entry in manifest.file_table(root).items() if rel.split("/", 1)[0] not in own}


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """The target's schedule (demo.py's own loop, `train_lm`)."""

    steps: int
    batch: int
    lr: float
    warmup: int = 50
    weight_decay: float = 0.1


@dataclass(frozen=True)
class DrafterRun:
    """One drafter's budget in `trtspec train` terms (TrainConfig.steps, .lr, .warmup: warmup then cosine to a
    tenth, warmup at most a tenth of the steps)."""

    steps: int
    lr: float
    warmup: int = 40


# family member -> the `trtspec train` kind that makes it
DRAFTERS = {"draft": "draft-model", "medusa": "medusa", "eagle": "eagle"}


@dataclass(frozen=True)
class FamilyConfig:
    seed: int = 0
    seq_len: int = 256           # target windows; the drafters' text samples (TrainConfig.text_tokens)
    target: Shape = Shape(n_layer=6, dim=512, n_head=8, n_kv_head=4, ffn=1408)
    target_stage: Stage = Stage(steps=1050, batch=16, lr=1.5e-3, warmup=60)
    draft_layers: int = 2        # the distilled draft: `trtspec train draft-model --layers --hidden`
    draft_hidden: int = 192
    draft_run: DrafterRun = DrafterRun(steps=2000, lr=3e-3)
    medusa_run: DrafterRun = DrafterRun(steps=500, lr=1e-3)
    eagle_run: DrafterRun = DrafterRun(steps=1000, lr=1e-3)
    drafter_batch: int = 16      # samples per drafter step (TrainConfig.batch_tokens = drafter_batch * seq_len)
    teacher_seqs: int = 2048     # text samples of seq_len tokens in the drafters' frozen-target pass
    topk: int = 32               # the teacher's top-k logits every drafter learns from
    eval_seqs: int = 48          # seq_len windows for train / held-out loss
    accept_prompts: int = 16
    accept_prompt_tokens: int = 64
    accept_new_tokens: int = 64
    max_files: int | None = None
    max_file_bytes: int | None = None
    threads: int = 2
    quick: bool = False

    @classmethod
    def quick_config(cls, seed: int = 0) -> FamilyConfig:
        """A few-second run for tests: tiny models, a corpus subset, a handful of steps."""
        return cls(
            seed=seed, seq_len=64,
            target=Shape(n_layer=2, dim=64, n_head=4, n_kv_head=2, ffn=128, max_pos=256),
            target_stage=Stage(steps=6, batch=8, lr=3e-3, warmup=2),
            draft_layers=1, draft_hidden=32, draft_run=DrafterRun(steps=4, lr=3e-3, warmup=1),
            medusa_run=DrafterRun(steps=3, lr=1e-3, warmup=1), eagle_run=DrafterRun(steps=3, lr=1e-3, warmup=1),
            drafter_batch=8, teacher_seqs=16, topk=8, eval_seqs=4, accept_prompts=2, accept_prompt_tokens=16,
            accept_new_tokens=8, max_files=50, max_file_bytes=12_000, quick=True,
        )

    def with_counts(self, *, threads: int | None = None, target_steps: int | None = None,
                    target_batch: int | None = None, draft_steps: int | None = None, medusa_steps: int | None = None,
                    eagle_steps: int | None = None, teacher_seqs: int | None = None) -> FamilyConfig:
        """This recipe with other step counts / sizes (None: keep); the target's warmup shrinks to at most a
        fifth of its steps (the drafter trainer caps its own at a tenth)."""
        given = {"target_steps": target_steps, "target_batch": target_batch, "draft_steps": draft_steps,
                 "medusa_steps": medusa_steps, "eagle_steps": eagle_steps, "teacher_seqs": teacher_seqs,
                 "threads": threads}
        for name, value in given.items():
            if value is not None and value < 1:
                raise ModelError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        st = replace(self.target_stage, steps=target_steps or self.target_stage.steps,
                     batch=target_batch or self.target_stage.batch)
        return replace(self, target_stage=replace(st, warmup=min(st.warmup, max(1, st.steps // 5))),
                       draft_run=replace(self.draft_run, steps=draft_steps or self.draft_run.steps),
                       medusa_run=replace(self.medusa_run, steps=medusa_steps or self.medusa_run.steps),
                       eagle_run=replace(self.eagle_run, steps=eagle_steps or self.eagle_run.steps),
                       teacher_seqs=teacher_seqs or self.teacher_seqs, threads=threads or self.threads)

    def drafter_config(self, member: str, text: Path, vocab: int):
        """The `trtspec train` config of family member `member` ("draft", "medusa", "eagle") on the plain-text
        file `text`: the whole vocabulary as the draft vocabulary (the demo's is small: no position is left
        out, and Medusa's lm_head rows are all trained), no held-out measurement of its own (the family's
        below), this family's seed."""
        from trtspec.train.drafters import TrainConfig

        run = {"draft": self.draft_run, "medusa": self.medusa_run, "eagle": self.eagle_run}[member]
        return TrainConfig(data=str(text), samples=self.teacher_seqs, text_tokens=self.seq_len, draft_vocab=vocab,
                           topk=self.topk, steps=run.steps, lr=run.lr, warmup=run.warmup,
                           batch_tokens=self.drafter_batch * self.seq_len, seed=self.seed, device="cpu",
                           eval_prompts=0, medusa_heads=4, noise=0.1, draft_layers=self.draft_layers,
                           draft_hidden=self.draft_hidden)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def _lr_at(stage: Stage, step: int) -> float:
    if step < stage.warmup:
        return stage.lr * (step + 1) / stage.warmup
    progress = (step - stage.warmup) / max(1, stage.steps - stage.warmup)
    return stage.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _optimizer(params: list[nn.Parameter], stage: Stage) -> torch.optim.AdamW:
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": stage.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=stage.lr, betas=(0.9, 0.95), eps=1e-8)


def _fit(phase: str, params: list[nn.Parameter], stage: Stage, loss_fn: Callable[[int], Tensor],
         report: Reporter) -> tuple[float, float]:
    """Shared loop: AdamW, warmup + cosine to 10 %, grad-clip 1, bf16 autocast.
    loss_fn(step) builds its own batch. Returns (mean loss of the last 10 % of steps, wall s)."""
    opt = _optimizer(params, stage)
    tail: list[float] = []
    t0 = time.perf_counter()
    for step in range(stage.steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(stage, step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        value = loss.item()
        if step >= stage.steps - max(1, stage.steps // 10):
            tail.append(value)
        report(phase, step + 1, stage.steps, value)
    return sum(tail) / len(tail), time.perf_counter() - t0


def train_lm(model, stream: Tensor, stage: Stage, seq_len: int, gen: torch.Generator, report: Reporter,
             phase: str = "target") -> tuple[float, float]:
    """Next-token cross-entropy on random seq_len windows of the token stream."""

    def loss_fn(step: int) -> Tensor:
        starts = torch.randint(0, len(stream) - seq_len - 1, (stage.batch,), generator=gen)
        batch = data.windows(stream, starts, seq_len + 1)
        return lm_loss(forward(model, batch[:, :-1])[0], batch[:, 1:])

    model.train()
    return _fit(phase, list(model.parameters()), stage, loss_fn, report)


# --------------------------------------------------------------------------------------------
# Measurement: losses, and acceptance through the runtime
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def heldout_loss(model, windows: Tensor, chunk: int = 8) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), chunk):
        w = windows[i: i + chunk]
        total += lm_loss(forward(model, w[:, :-1])[0], w[:, 1:], reduction="sum").item()
        count += w[:, 1:].numel()
    return total / count


@contextlib.contextmanager
def _fp32_drafters() -> Iterator[None]:
    """Drafters in float32 while measuring, so the numbers do not depend on the CPU's bf16 support."""
    old = os.environ.get("TRTSPEC_DRAFT_DTYPE")
    os.environ["TRTSPEC_DRAFT_DTYPE"] = "float32"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRTSPEC_DRAFT_DTYPE", None)
        else:
            os.environ["TRTSPEC_DRAFT_DTYPE"] = old


def measure_acceptance(root: Path, prompts: list[list[int]], n_new: int, plans: dict[str, Sequence[int]],
                       report: Reporter = _silent) -> dict[str, dict]:
    """Greedy speculative decoding of the written family through trtspec's runtime, per method and fixed K:
    τ = new tokens / target forwards (prefill counted), acc = accepted / drafted, and how many outputs equal
    the runtime's plain decoding (they all must)."""
    from trtspec.artifacts.tokenizer import load_tokenizer
    from trtspec import methods
    from trtspec.runtime import SamplingParams
    from trtspec.spec import spec_from_dict

    tok = load_tokenizer(root / "target")
    where = {"draft-model": {"draft": "draft"}, "medusa": {"heads": "medusa"}, "eagle": {"heads": "eagle"}}
    out: dict[str, dict] = {}
    reference: list[list[int]] | None = None
    with _fp32_drafters():
        for i, (method, ks) in enumerate(plans.items()):
            spec = spec_from_dict({
                "schema": 1, "model": {"name": f"demo-{method}", "target": "target", "dtype": "float32"},
                "speculative": {"method": method, "num_draft_tokens": max(ks), **where[method],
                                "adaptive": {"enabled": False}},
                "limits": {"max_batch_size": 1, "max_input_len": max(len(p) for p in prompts),
                           "max_output_len": n_new},
                "runtime": {"kind": "torch", "device": "cpu"}}, base=root)
            engine = methods.engine(spec, tokenizer=tok)
            try:
                if reference is None:
                    plain = SamplingParams(max_new_tokens=n_new, end_id=-1, num_draft_tokens=0)
                    reference = [engine.generate(p, plain).tokens for p in prompts]
                out[method] = {}
                for k in ks:
                    sp = SamplingParams(max_new_tokens=n_new, end_id=-1, num_draft_tokens=k)
                    results = [engine.generate(p, sp) for p in prompts]
                    drafted, accepted = sum(r.drafted for r in results), sum(r.accepted for r in results)
                    same = sum(r.tokens == ref for r, ref in zip(results, reference))
                    out[method][str(k)] = {
                        "tau": round(sum(len(r.tokens) for r in results) / sum(r.steps + 1 for r in results), 3),
                        "acceptance_rate": round(accepted / max(1, drafted), 3),
                        "matches_plain_greedy": f"{same}/{len(prompts)}"}
            finally:
                engine.close()
            report("measure", i + 1, len(plans), None)
    return out


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------


def _fp16_roundtrip(m: nn.Module) -> None:
    """Round the weights to float16 in place (what is shipped) so later stages see them."""
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.float16).float())


def save_llama(model, shape: Shape, out: Path, tokenizer_dir: Path) -> None:
    """A transformers LlamaForCausalLM checkpoint (safetensors) in float16 plus the shared tokenizer files."""
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(str(out))  # safetensors (the only format transformers 5 writes)
    model.to(torch.float32)  # lossless: the weights were rounded to float16 already
    write_json(out / CONFIG, with_legacy_keys(read_json(out / CONFIG) or {}, shape.model_config("float16")))
    GenerationConfig(bos_token_id=0, eos_token_id=0, pad_token_id=0, do_sample=False).save_pretrained(str(out))
    for name in data.TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out / name)


# --------------------------------------------------------------------------------------------
# The whole family
# --------------------------------------------------------------------------------------------


def _r(x: float) -> float:
    return round(float(x), 4)


def train_family(out: str | Path, cfg: FamilyConfig = FamilyConfig(), report: Reporter = _silent,
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


def _load_llama(path: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _train_into(root: Path, cfg: FamilyConfig, report: Reporter, log: Callable[[str], None],
                source: Path | None = None) -> tuple[dict, dict]:
    """Train and write the family into `root`; returns (the manifest's inputs, its kind-specific fields)."""
    from trtspec.artifacts.tokenizer import load_tokenizer_json
    from trtspec.train.drafters import train_drafter

    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    T = cfg.seq_len

    # -- corpus + tokenizer (a reused target brings its own)
    corpus = data.stdlib_corpus(max_files=cfg.max_files, max_file_bytes=cfg.max_file_bytes)
    train_texts = [corpus.read(f) for f in corpus.train_files]
    held_texts = [corpus.read(f) for f in corpus.heldout_files]
    models: dict[str, dict] = {}
    if source is None:
        tok = data.train_tokenizer(train_texts)
        tok_dir = root / ".tokenizer"
        data.save_tokenizer(tok, tok_dir)
    else:
        models["target"] = _reused_target(source, root / "target")
        tok = load_tokenizer_json(root / "target")
        log(f"target: reused {source}")
    train_stream, held_stream = data.encode_files(tok, train_texts), data.encode_files(tok, held_texts)
    log(f"corpus: {len(corpus.train_files)} train files ({len(train_stream):,} tokens), "
        f"{len(corpus.heldout_files)} held out ({len(held_stream):,} tokens)")
    train_eval = data.eval_windows(train_stream, cfg.eval_seqs, T)
    held_eval = data.eval_windows(held_stream, cfg.eval_seqs, T)

    # -- target
    if source is None:
        target = llama(cfg.target)
        last, wall = train_lm(target, train_stream, cfg.target_stage, T, gen, report)
        _fp16_roundtrip(target)
        save_llama(target, cfg.target, root / "target", tok_dir)
        shutil.rmtree(tok_dir)
        models["target"] = {
            "path": "target", "params": n_params(target), "shape": asdict(cfg.target),
            "train": {**asdict(cfg.target_stage), "seq_len": T, "wall_s": round(wall, 1),
                      "tokens_seen": cfg.target_stage.steps * cfg.target_stage.batch * T,
                      "final_train_loss_ema": _r(last)}}
    else:
        target = _load_llama(root / "target")
        models["target"].setdefault("params", n_params(target))
    models["target"]["loss"] = {"train": _r(heldout_loss(target, train_eval)),
                                "heldout": _r(heldout_loss(target, held_eval))}
    log(f"target: {models['target']['loss']}")
    del target

    # -- the drafters: `trtspec train` on the corpus' training text, one work dir (one teacher pass) for all
    work = root / ".work"
    text = _corpus_text(work / "corpus.jsonl", train_texts, cfg.seed)
    vocab = tok.get_vocab_size()
    for name, kind in DRAFTERS.items():
        m = train_drafter(kind, root / "target", root / name, cfg.drafter_config(name, text, vocab), work=work,
                          report=_as_phase(report, name), log=log, target_name="../target")
        (root / name / manifest.FILE_NAMES[manifest.TRAIN]).unlink()  # the family's MANIFEST records it
        models[name] = {"path": name, "params": m["params"], "trainer": _trainer_record(m, text)}
        log(f"{name}: {m['budget']['steps_done']} steps in {m['budget']['wall_s']['train']:.0f}s")
    teacher_info = {"sequences": m["inputs"]["data"]["samples"], "seq_len": T, "topk": cfg.topk,
                    "tokens": m["inputs"]["data"]["tokens"], "draft_vocab_size": m["draft_vocab_size"],
                    "wall_s": {k: round(float(v), 1) for k, v in m["budget"]["wall_s"].items()
                               if k in ("data", "features", "hidden")},
                    "stored": "the target's top-k logits (fp16) and final hidden states, by trtspec train"}
    shutil.rmtree(work)
    draft = _load_llama(root / "draft")
    models["draft"]["loss"] = {"train": _r(heldout_loss(draft, train_eval)), "heldout": _r(heldout_loss(draft, held_eval))}
    del draft

    # -- measurement (fp32 compute on the fp16 weights)
    t0 = time.perf_counter()
    prompt_texts = data.snippets(tok, corpus.root, corpus.heldout_files, cfg.accept_prompts,
                                 cfg.accept_prompt_tokens, cfg.seed)
    prompts = [tok.encode(p).ids for p in prompt_texts]
    n_new = cfg.accept_new_tokens
    acceptance = measure_acceptance(root, prompts, n_new, {"draft-model": (2, 4, 8), "medusa": (4,), "eagle": (4,)},
                                    report)
    for method, name in (("draft-model", "draft"), ("medusa", "medusa"), ("eagle", "eagle")):
        models[name]["acceptance"] = acceptance[method]
    log(f"measurement in {time.perf_counter() - t0:.0f}s")

    inputs = {"corpus": {
        "source": "python stdlib *.py (sysconfig stdlib path)",
        "excluded": "test/tests/test_*/idle_test dirs, " + ", ".join(data.EXCLUDED_DIRS),
        "split_rule": f"sorted relative paths; file i held out iff i % {data.HELDOUT_EVERY} == {data.HELDOUT_OFFSET}",
        "train_files": len(corpus.train_files), "train_tokens": len(train_stream),
        "heldout_tokens": len(held_stream), "heldout_files": list(corpus.heldout_files),
    }}
    if source is not None:
        inputs["target"] = {"path": str(source), "family_manifest_matches": "train" in models["target"]}
    flags = (" --quick" if cfg.quick else "") + (" --target" if source is not None else "")
    return inputs, {
        "created_by": "trtspec models train-demo" + flags,
        "seed": cfg.seed,
        "config": asdict(cfg),
        "machine": {"cpus": os.cpu_count(), "threads": cfg.threads, "platform": platform.platform()},
        "tokenizer": {"type": "byte-level BPE", "vocab_size": vocab, "special_tokens": [data.EOT],
                      "bos_eos_pad": data.EOT, "files": list(data.TOKENIZER_FILES)},
        "teacher_pass": teacher_info,
        "measurement": {
            "what": "greedy speculative decoding through trtspec.runtime.SpecEngine (KV cache, fixed K, no EOS "
                    "stop), fp32 compute on the fp16 weights",
            "prompts": len(prompts), "prompt_tokens": cfg.accept_prompt_tokens, "new_tokens": n_new,
            "prompt_source": "heldout_prompts(n, prompt_tokens, seed)",
            "tau": "new tokens / target forwards (prefill counted)",
            "acceptance_rate": "accepted drafted tokens / drafted tokens",
            "chain": "medusa/eagle candidate = [target's next token, K head guesses]",
        },
        "models": models,
    }
