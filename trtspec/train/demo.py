"""The shipped demo model family: a small Llama target and three drafters, trained on the Python standard
library in 40-50 minutes on two CPU cores (fixed steps, seed 0). `trtspec models train-demo` drives
`train_family`.

Layout written by `train_family(out)` (head layouts: trtspec.artifacts.heads)::

    out/
      MANIFEST.json        an artifacts.manifest (kind "demo-family"): inputs (the corpus split), outputs
                           (sha256 + size of every file), seeds, steps, losses, acceptance
      target/              LlamaForCausalLM (config.json, model.safetensors, generation_config.json,
                           tokenizer.json, tokenizer_config.json, special_tokens_map.json)
      draft/               a small LlamaForCausalLM distilled from the target, same tokenizer files
      medusa/              medusa_lm_head.safetensors + config.json  (TensorRT-LLM Medusa layout)
      eagle/               model.safetensors + config.json           (EAGLE-1 layout)

All weights are stored in float16. Target and draft are transformers' LlamaForCausalLM, the EAGLE head is
transformers' LlamaDecoderLayer (train/heads.py); the only Llama trtspec implements itself is the runtime's.

Recipe: the target is trained on next-token CE; one frozen-target pass over a fixed training subset stores
f_t and the top-k logits; the draft learns KL to the top-k plus a little CE; Medusa head h learns the
teacher's top-k at position t+1+h (self-distillation); EAGLE learns smooth-L1(f^_{t+1}, f_{t+1}) +
0.1 * CE(L f^_{t+1}, teacher top-k). Acceptance is measured by the runtime itself (SpecEngine, greedy,
fixed K) on held-out prompts, against its own plain decoding.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn

from trtspec.artifacts import heads as layouts
from trtspec.artifacts import manifest
from trtspec.artifacts.fs import atomic_dir, read_json, write_json
from trtspec.artifacts.hf import CONFIG, with_legacy_keys
from trtspec.errors import ModelError
from trtspec.train import data
from trtspec.train.heads import (EagleHead, MedusaHeads, Shape, eagle_loss, forward, llama, lm_loss, medusa_loss,
                                 n_params, soft_ce)

MANIFEST_FORMAT = 2  # 1: the shipped family's (before the common manifest shape; still read)

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
    steps: int
    batch: int
    lr: float
    warmup: int = 50
    weight_decay: float = 0.1


@dataclass(frozen=True)
class FamilyConfig:
    seed: int = 0
    seq_len: int = 256
    target: Shape = Shape(n_layer=6, dim=512, n_head=8, n_kv_head=4, ffn=1408)
    draft: Shape = Shape(n_layer=2, dim=192, n_head=6, n_kv_head=2, ffn=512)
    target_stage: Stage = Stage(steps=1050, batch=16, lr=1.5e-3, warmup=60)
    draft_stage: Stage = Stage(steps=2000, batch=16, lr=3e-3)
    medusa_stage: Stage = Stage(steps=500, batch=16, lr=1e-3, weight_decay=0.0)
    eagle_stage: Stage = Stage(steps=1000, batch=16, lr=1e-3, weight_decay=0.0)
    teacher_seqs: int = 4096     # sequences of seq_len in the frozen-target pass
    topk: int = 16
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
            draft=Shape(n_layer=1, dim=32, n_head=2, n_kv_head=1, ffn=64, max_pos=256),
            target_stage=Stage(steps=6, batch=8, lr=3e-3, warmup=2),
            draft_stage=Stage(steps=4, batch=8, lr=3e-3, warmup=2),
            medusa_stage=Stage(steps=3, batch=8, lr=1e-3, warmup=1, weight_decay=0.0),
            eagle_stage=Stage(steps=3, batch=8, lr=1e-3, warmup=1, weight_decay=0.0),
            teacher_seqs=16, topk=8, eval_seqs=4, accept_prompts=2, accept_prompt_tokens=16,
            accept_new_tokens=8, max_files=50, max_file_bytes=12_000, quick=True,
        )

    def with_counts(self, *, threads: int | None = None, target_steps: int | None = None,
                    target_batch: int | None = None, draft_steps: int | None = None, medusa_steps: int | None = None,
                    eagle_steps: int | None = None, teacher_seqs: int | None = None) -> FamilyConfig:
        """This recipe with other step counts / sizes (None: keep); warmups shrink to at most a fifth."""
        given = {"target_steps": target_steps, "target_batch": target_batch, "draft_steps": draft_steps,
                 "medusa_steps": medusa_steps, "eagle_steps": eagle_steps, "teacher_seqs": teacher_seqs,
                 "threads": threads}
        for name, value in given.items():
            if value is not None and value < 1:
                raise ModelError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        stages = {"target_stage": replace(self.target_stage, steps=target_steps or self.target_stage.steps,
                                          batch=target_batch or self.target_stage.batch),
                  "draft_stage": replace(self.draft_stage, steps=draft_steps or self.draft_stage.steps),
                  "medusa_stage": replace(self.medusa_stage, steps=medusa_steps or self.medusa_stage.steps),
                  "eagle_stage": replace(self.eagle_stage, steps=eagle_steps or self.eagle_stage.steps)}
        stages = {k: replace(st, warmup=min(st.warmup, max(1, st.steps // 5))) for k, st in stages.items()}
        return replace(self, **stages, teacher_seqs=teacher_seqs or self.teacher_seqs,
                       threads=threads or self.threads)


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


@dataclass
class TeacherPass:
    """The frozen target's outputs on a fixed training subset (computed once).

    ids [N, T+1] (position T is only a label), feats [N, T, H] fp16 = f_t,
    top_logits / top_ids [N, T, k] = the target's top-k logits at each position (predicting t+1)."""

    ids: Tensor
    feats: Tensor
    top_logits: Tensor
    top_ids: Tensor
    wall_s: float = 0.0

    def batch(self, n: int, gen: torch.Generator) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        rows = torch.randint(0, len(self.ids), (n,), generator=gen)
        return self.ids[rows], self.feats[rows].float(), self.top_logits[rows], self.top_ids[rows]


@torch.no_grad()
def teacher_pass(target, stream: Tensor, n_seqs: int, seq_len: int, k: int, gen: torch.Generator,
                 report: Reporter, chunk: int = 16) -> TeacherPass:
    t0 = time.perf_counter()
    n_slots = (len(stream) - 1) // (seq_len + 1)
    n_seqs = min(n_seqs, n_slots)
    slots = torch.randperm(n_slots, generator=gen)[:n_seqs].sort().values
    ids = data.windows(stream, slots * (seq_len + 1), seq_len + 1)
    feats = torch.empty(n_seqs, seq_len, target.config.hidden_size, dtype=torch.float16)
    top_logits = torch.empty(n_seqs, seq_len, k, dtype=torch.float16)
    top_ids = torch.empty(n_seqs, seq_len, k, dtype=torch.int16)
    target.eval()
    for i in range(0, n_seqs, chunk):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, f = forward(target, ids[i: i + chunk, :-1])
        vals, idx = logits.float().topk(k, dim=-1)
        feats[i: i + chunk] = f.to(torch.float16)
        top_logits[i: i + chunk] = vals.to(torch.float16)
        top_ids[i: i + chunk] = idx.to(torch.int16)
        report("teacher", min(i + chunk, n_seqs), n_seqs, None)
    return TeacherPass(ids, feats, top_logits, top_ids, time.perf_counter() - t0)


def train_draft(draft, tp: TeacherPass, stage: Stage, gen: torch.Generator, report: Reporter,
                ce_weight: float = 0.1) -> tuple[float, float]:
    def loss_fn(step: int) -> Tensor:
        ids, _, top_logits, top_ids = tp.batch(stage.batch, gen)
        logits, _ = forward(draft, ids[:, :-1])
        return soft_ce(logits, top_logits, top_ids) + ce_weight * lm_loss(logits, ids[:, 1:])

    draft.train()
    return _fit("draft", list(draft.parameters()), stage, loss_fn, report)


def train_medusa(heads: MedusaHeads, tp: TeacherPass, stage: Stage, gen: torch.Generator,
                 report: Reporter) -> tuple[float, float]:
    def loss_fn(step: int) -> Tensor:
        ids, f, top_logits, top_ids = tp.batch(stage.batch, gen)
        return medusa_loss(heads, f, ids, top_logits, top_ids)

    heads.train()
    return _fit("medusa", list(heads.parameters()), stage, loss_fn, report)


def train_eagle(head: EagleHead, target, tp: TeacherPass, stage: Stage, gen: torch.Generator,
                report: Reporter, noise: float = 0.1) -> tuple[float, float]:
    """Inputs E[x_{t+1}] and f_t with uniform noise (EAGLE-1 recipe). E and L stay frozen."""
    embed, lm_head = target.model.embed_tokens, target.lm_head

    def loss_fn(step: int) -> Tensor:
        ids, f, top_logits, top_ids = tp.batch(stage.batch, gen)
        f_in = f[:, :-1] + (torch.rand(f[:, :-1].shape, generator=gen) - 0.5) * 2 * noise
        with torch.no_grad():
            e = embed(ids[:, 1:-1])
        pred = head(e, f_in)
        return eagle_loss(pred, f[:, 1:], lm_head(pred), top_logits[:, 1:], top_ids[:, 1:])

    for p in target.parameters():
        p.requires_grad_(False)
    head.train()
    return _fit("eagle", list(head.parameters()), stage, loss_fn, report)


# --------------------------------------------------------------------------------------------
# Measurement: losses, teacher-forced agreement, and acceptance through the runtime
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


@torch.no_grad()
def draft_agreement(target, draft, windows: Tensor) -> float:
    """Teacher-forced α: how often argmax draft == argmax target at the same position."""
    tl, _ = forward(target, windows[:, :-1])
    dl, _ = forward(draft, windows[:, :-1])
    return (tl.argmax(-1) == dl.argmax(-1)).float().mean().item()


@torch.no_grad()
def medusa_eval(target, heads: MedusaHeads, windows: Tensor) -> dict:
    """Per head: top-1 agreement with the target's greedy token at t+1+h, and CE on x_{t+2+h}."""
    tl, f = forward(target, windows[:, :-1])
    greedy = tl.argmax(-1)
    logits = heads(f)
    T = f.shape[1]
    top1, ce = [], []
    for h in range(len(heads.heads)):
        valid = T - 1 - h
        lh = logits[h, :, :valid]
        top1.append((lh.argmax(-1) == greedy[:, 1 + h:]).float().mean().item())
        ce.append(lm_loss(lh, windows[:, 2 + h: 2 + h + valid]).item())
    return {"top1": top1, "heldout_ce": ce}


@torch.no_grad()
def eagle_eval(target, head: EagleHead, windows: Tensor) -> dict:
    """Teacher-forced: top-1 of L f^_{t+1} vs the target's greedy token at t+1; CE on x_{t+2}."""
    tl, f = forward(target, windows[:, :-1])
    pred = head(target.model.embed_tokens(windows[:, 1:-1]), f[:, :-1])
    logits = target.lm_head(pred)
    return {
        "top1": (logits.argmax(-1) == tl[:, 1:].argmax(-1)).float().mean().item(),
        "heldout_ce": lm_loss(logits, windows[:, 2:]).item(),
        "feature_smooth_l1": torch.nn.functional.smooth_l1_loss(pred, f[:, 1:]).item(),
    }


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
    from trtspec.runtime import SamplingParams, SpecEngine
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
            engine = SpecEngine.from_spec(spec, tokenizer=tok)
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


def _fp16(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    return {k: v.detach().to(torch.float16) for k, v in tensors.items()}


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


def save_medusa(heads: MedusaHeads, s: Shape, out: Path) -> None:
    layouts.write_medusa(out, _fp16(heads.layout_tensors()), hidden_size=s.dim, vocab_size=s.vocab, num_layers=1,
                         base_model_name_or_path="../target")


def save_eagle(head: EagleHead, s: Shape, out: Path) -> None:
    layer = replace(s, n_layer=1)
    cfg = {**layer.hf_config("float16").to_diff_dict(), "eagle": True, "base_model_name_or_path": "../target",
           "bias": True}  # bias: fc has one (EAGLE-1)
    layouts.write_eagle(out, _fp16(head.state_dict()), with_legacy_keys(cfg, layer.model_config("float16")))


# --------------------------------------------------------------------------------------------
# The whole family
# --------------------------------------------------------------------------------------------


def _r(x: float) -> float:
    return round(float(x), 4)


def train_family(out: str | Path, cfg: FamilyConfig = FamilyConfig(), report: Reporter = _silent,
                 force: bool = False, log: Callable[[str], None] = lambda s: None) -> dict:
    """Train tokenizer, target, draft, Medusa and EAGLE heads; write them atomically to `out`.

    Training happens in a temporary directory next to `out`, which replaces it at the end (artifacts.fs
    .atomic_dir); an existing non-empty `out` is replaced only with force=True. Returns the manifest."""
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise ModelError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ModelError(f"{out} is not empty", hint="pass --force to replace it")
    torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    with atomic_dir(out) as tmp:
        inputs, fields = _train_into(tmp, cfg, report, log)
        record = manifest.new(manifest.DEMO, MANIFEST_FORMAT, inputs=inputs, outputs=file_table(tmp), **fields,
                              wall_s_total=round(time.perf_counter() - t_start, 1))
        manifest.write(tmp / manifest.FILE_NAMES[manifest.DEMO], record)
    return record


def _train_into(root: Path, cfg: FamilyConfig, report: Reporter, log: Callable[[str], None]) -> tuple[dict, dict]:
    """Train and write the family into `root`; returns (the manifest's inputs, its kind-specific fields)."""
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    T = cfg.seq_len

    # -- corpus + tokenizer
    corpus = data.stdlib_corpus(max_files=cfg.max_files, max_file_bytes=cfg.max_file_bytes)
    train_texts = [corpus.read(f) for f in corpus.train_files]
    held_texts = [corpus.read(f) for f in corpus.heldout_files]
    tok = data.train_tokenizer(train_texts)
    tok_dir = root / ".tokenizer"
    data.save_tokenizer(tok, tok_dir)
    train_stream, held_stream = data.encode_files(tok, train_texts), data.encode_files(tok, held_texts)
    log(f"corpus: {len(corpus.train_files)} train files ({len(train_stream):,} tokens), "
        f"{len(corpus.heldout_files)} held out ({len(held_stream):,} tokens)")
    train_eval = data.eval_windows(train_stream, cfg.eval_seqs, T)
    held_eval = data.eval_windows(held_stream, cfg.eval_seqs, T)
    models: dict[str, dict] = {}

    # -- target
    target = llama(cfg.target)
    last, wall = train_lm(target, train_stream, cfg.target_stage, T, gen, report)
    _fp16_roundtrip(target)
    save_llama(target, cfg.target, root / "target", tok_dir)
    models["target"] = {
        "path": "target", "params": n_params(target), "shape": asdict(cfg.target),
        "train": {**asdict(cfg.target_stage), "seq_len": T, "wall_s": round(wall, 1),
                  "tokens_seen": cfg.target_stage.steps * cfg.target_stage.batch * T,
                  "final_train_loss_ema": _r(last)},
        "loss": {"train": _r(heldout_loss(target, train_eval)), "heldout": _r(heldout_loss(target, held_eval))},
    }
    log(f"target: {models['target']['loss']} in {wall:.0f}s")
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)

    # -- one frozen-target pass shared by draft, Medusa and EAGLE
    tp = teacher_pass(target, train_stream, cfg.teacher_seqs, T, cfg.topk, gen, report)
    teacher_info = {"sequences": len(tp.ids), "seq_len": T, "topk": cfg.topk, "wall_s": round(tp.wall_s, 1),
                    "stored": "f_t (fp16) and top-k logits of the fp16-rounded target, bf16 autocast"}
    log(f"teacher pass: {len(tp.ids)} x {T} tokens in {tp.wall_s:.0f}s")

    # -- draft
    draft = llama(cfg.draft)
    last, wall = train_draft(draft, tp, cfg.draft_stage, gen, report)
    _fp16_roundtrip(draft)
    save_llama(draft, cfg.draft, root / "draft", tok_dir)
    models["draft"] = {
        "path": "draft", "params": n_params(draft), "shape": asdict(cfg.draft),
        "train": {**asdict(cfg.draft_stage), "seq_len": T, "wall_s": round(wall, 1),
                  "teacher_topk": cfg.topk, "final_train_loss_ema": _r(last)},
        "loss": {"train": _r(heldout_loss(draft, train_eval)), "heldout": _r(heldout_loss(draft, held_eval))},
    }
    draft.eval()
    log(f"draft: {models['draft']['loss']} in {wall:.0f}s")

    # -- Medusa
    medusa = MedusaHeads(cfg.target.dim, cfg.target.vocab)
    with torch.no_grad():
        for head in medusa.heads:
            head[1].weight.copy_(target.lm_head.weight)
    last, wall = train_medusa(medusa, tp, cfg.medusa_stage, gen, report)
    _fp16_roundtrip(medusa)
    save_medusa(medusa, cfg.target, root / "medusa")
    medusa.eval()
    models["medusa"] = {
        "path": "medusa", "params": n_params(medusa), "num_heads": len(medusa.heads),
        "train": {**asdict(cfg.medusa_stage), "wall_s": round(wall, 1), "final_train_loss_ema": _r(last)},
    }
    log(f"medusa: trained in {wall:.0f}s")

    # -- EAGLE
    eagle = EagleHead(cfg.target)
    last, wall = train_eagle(eagle, target, tp, cfg.eagle_stage, gen, report)
    _fp16_roundtrip(eagle)
    save_eagle(eagle, cfg.target, root / "eagle")
    eagle.eval()
    models["eagle"] = {
        "path": "eagle", "params": n_params(eagle), "train": {**asdict(cfg.eagle_stage), "wall_s": round(wall, 1),
                                                          "final_train_loss_ema": _r(last)},
    }
    log(f"eagle: trained in {wall:.0f}s")
    del tp

    # -- measurement (fp32 compute on the fp16-rounded weights)
    t0 = time.perf_counter()
    with torch.no_grad():
        agree_windows = held_eval[: max(1, cfg.eval_seqs // 2)]
        models["draft"]["alpha_teacher_forced"] = _r(draft_agreement(target, draft, agree_windows))
        med = medusa_eval(target, medusa, agree_windows)
        models["medusa"]["head_top1"] = [_r(x) for x in med["top1"]]
        models["medusa"]["heldout_ce"] = [_r(x) for x in med["heldout_ce"]]
        eag = eagle_eval(target, eagle, agree_windows)
        models["eagle"].update({k: _r(v) for k, v in eag.items()})
    shutil.rmtree(tok_dir)
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
    return inputs, {
        "created_by": "trtspec models train-demo" + (" --quick" if cfg.quick else ""),
        "seed": cfg.seed,
        "config": asdict(cfg),
        "machine": {"cpus": os.cpu_count(), "threads": cfg.threads, "platform": platform.platform()},
        "tokenizer": {"type": "byte-level BPE", "vocab_size": tok.get_vocab_size(), "special_tokens": [data.EOT],
                      "bos_eos_pad": data.EOT, "files": list(data.TOKENIZER_FILES)},
        "teacher_pass": teacher_info,
        "measurement": {
            "what": "greedy speculative decoding through trtspec.runtime.SpecEngine (KV cache, fixed K, no EOS "
                    "stop), fp32 compute on the fp16 weights",
            "prompts": len(prompts), "prompt_tokens": cfg.accept_prompt_tokens, "new_tokens": n_new,
            "prompt_source": "heldout_prompts(n, prompt_tokens, seed)",
            "alpha": "teacher-forced argmax agreement on held-out windows",
            "tau": "new tokens / target forwards (prefill counted)",
            "acceptance_rate": "accepted drafted tokens / drafted tokens",
            "medusa_head_top1": "head h at t vs the target's greedy token at t+1+h, teacher-forced",
            "chain": "medusa/eagle candidate = [target's next token, K head guesses]",
        },
        "models": models,
    }
