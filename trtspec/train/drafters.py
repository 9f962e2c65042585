"""`trtspec train eagle3|eagle|medusa|draft-model`: a drafter for the user's own target, the way SpecForge /
vllm-project/speculators train EAGLE-3 heads, small enough for a CPU and a small model. Every kind runs the
same stages on the same cached data (one work dir can serve all four: `--work`); each stage is cached in the
work dir (so a killed run resumes where it stopped, `--resume`). This module runs them; one module each:

  1. data       (samples.py) prompts (a builtin set, or a .jsonl of {"prompt"} / {"messages"}) answered by
                the target itself through trtspec's runtime (SpecEngine.generate_batch, plain decoding,
                temperature 0.8), each a user turn in the chat template when the tokenizer has one; or plain
                text (a .txt, or a .jsonl of {"text"}) trained as it is. Appended to data.jsonl as it is
                generated.
  2. features   (features.py) the draft vocabulary (the `draft_vocab` most frequent target ids of the trained
                tokens, the target's EOS ids always in), then one frozen-target pass over every sample: the
                target's top-k logits over the draft vocabulary and, for EAGLE-3, the three captured layers
                (fp16), or for the other kinds the final (post-norm) hidden state f_t that Medusa and EAGLE-1
                read, stored once in features.safetensors (never recomputed per epoch). Only when the cached
                features are an EAGLE-3 run's do Medusa and EAGLE-1 need one more pass for f_t (logits
                skipped; hidden.safetensors, keyed by the data alone).
  3. train      (loop.py; each kind's module and loss: kinds.py, losses.py) AdamW, warmup + cosine, seeded
                batch order; a budget of --steps or --minutes; checkpoints
                `checkpoint[-kind]/{head,optimizer}.safetensors` + state.json, no pickle, every `checkpoint_s`
                seconds and at the end. Every loss is a soft cross-entropy against the target's top-k over the
                draft vocabulary (positions whose target argmax lies outside it are left out), so that all
                kinds learn from the very same teacher rows:
                  eagle3       the TTT loss (train/eagle3_head.py)
                  eagle        EAGLE-1: smooth-L1(f^_{t+1}, f_{t+1}) + 0.1 soft-CE(L f^_{t+1}), inputs
                               (E[x_{t+1}], f_t + uniform noise); L = the target's lm_head, frozen
                  medusa       head h at t against the teacher at t+1+h (0.8^h); the residual blocks train,
                               and the lm_head rows of the draft vocabulary (initialised from the target's;
                               the other rows stay the target's)
                  draft-model  a small Llama (--draft-layers/--draft-hidden; the target's vocabulary and
                               tokenizer, embeddings and lm_head initialised from the target's when the
                               widths agree) on full-vocabulary logits against the same teacher rows
  4. export     (writers.py) fp16 weights in the layout the method loads (artifacts.heads.write_eagle3 /
                write_eagle / write_medusa, a LlamaForCausalLM dir for draft-model) + trtspec.train.json (data,
                budget, losses, measured acceptance), written atomically into --out.
  5. measure    (acceptance.py) greedy speculative decoding through SpecEngine on held-out prompts (never
                trained on): K-token chain and a tree, tokens per verify step, acceptance rate, identity with
                plain.

Work dir: .trtspec/train/<out name>/ (gitignored); pass the same --work (and --draft-vocab) to train another
kind on an existing run's data and features. `trtspec models train-demo` is one use of it (train/demo.py:
it trains its own target first, then its draft-model, Medusa and EAGLE-1 drafters here, on plain text of its
corpus' training split).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trtspec.artifacts import heads as layouts
from trtspec.artifacts import manifest
from trtspec.artifacts.fs import atomic_dir, digest
from trtspec.artifacts.hf import ModelConfig
from trtspec.errors import ModelError, SpecError
from trtspec.train.acceptance import measure
from trtspec.train.features import make_features, make_hidden
from trtspec.train.kinds import Drafter, build
from trtspec.train.loop import train_head
from trtspec.train.recipe import Reporter, TrainConfig, silent
from trtspec.train.samples import make_data, target_id

MANIFEST_FORMAT = 1
KINDS = ("eagle3", "eagle", "medusa", "draft-model")
METHOD = {"eagle3": "eagle", "eagle": "eagle", "medusa": "medusa", "draft-model": "draft-model"}  # what serves it


def default_out(target: Path, kind: str = "eagle3") -> Path:
    return Path(target).parent / f"{Path(target).name}-{kind}"


def train_eagle3(target: Path, out: Path, cfg: TrainConfig, **kw) -> dict[str, Any] | None:
    """Train an EAGLE-3 head (train_drafter("eagle3", ...))."""
    return train_drafter("eagle3", target, out, cfg, **kw)


def train_drafter(kind: str, target: Path, out: Path, cfg: TrainConfig, *, resume: bool = False,
                  work: Path | None = None, report: Reporter = silent, log: Callable[[str], None] = lambda s: None,
                  until: str | None = None, target_name: str | None = None,
                  weights: str | None = None) -> dict[str, Any] | None:
    """Train a `kind` drafter for the checkpoint `target` into `out` (replaced atomically); returns its
    manifest. `until` = "data" | "features": stop after that stage (cached in the work dir; None returned),
    so that a shared machine can run the stages as separate bounded jobs. `target_name`: how the heads'
    configs name the target (base_model_name_or_path; the demo family's say "../target", its sibling).
    `weights`: the spec key under which the method that serves this kind (METHOD[kind]) reads the drafter's
    dir, "draft" or "heads"; the caller asks the method (`trtspec train` does); the measurement on held-out
    prompts needs it."""
    from trtspec.artifacts.tokenizer import load_tokenizer

    if kind not in KINDS:
        raise SpecError(f"no drafter kind {kind!r}", hint=f"one of {', '.join(KINDS)}")
    target, out = Path(target), Path(out)
    if cfg.steps is None and cfg.minutes is None and until is None:
        raise SpecError("no training budget", hint="pass --steps N or --minutes M")
    tcfg = ModelConfig.from_dir(target)
    work = Path(work) if work is not None else Path(".trtspec") / "train" / out.name
    work.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(target)
    t0 = time.perf_counter()
    data = make_data(work, target, cfg, tok, report, log)
    if not data["samples"]:
        raise ModelError("no training samples were made", hint="give more prompts or text with --data")
    if until == "data":
        return None
    aux = layouts.default_aux_layers(tcfg.num_layers)
    feats, wall = _features(kind, work, target, cfg, data, aux, report, log)
    if until == "features":
        return None
    drafter = build(kind, target, tcfg, cfg, feats, target_name)
    key = digest({"data": data["sha256"], "aux": list(aux), "vocab": len(feats["used"]), "recipe": cfg.recipe(kind),
                  **({"kind": kind} if kind != "eagle3" else {})})
    record = train_head(work, drafter.module, feats, cfg, key, resume, report, log, drafter.loss,
                        "checkpoint" if kind == "eagle3" else f"checkpoint-{kind}")
    drafter.module.eval()
    with atomic_dir(out) as tmp:
        drafter.write(tmp)
        acceptance = measure(tmp, target, tok, data["heldout"], cfg, report, method=METHOD[kind], weights=weights)
        made = _manifest(kind, target, tcfg, cfg, data, feats, aux, drafter, record, wall,
                         round(time.perf_counter() - t0, 1), acceptance, tmp)
        manifest.write(tmp / manifest.FILE_NAMES[manifest.TRAIN], made)
    return made


def _features(kind: str, work: Path, target: Path, cfg: TrainConfig, data: dict, aux: tuple[int, ...],
              report: Reporter, log) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The stored features `kind` trains on (the captured layers: EAGLE-3's; the final hidden states:
    Medusa's and EAGLE-1's, by one more pass when the cached features are an EAGLE-3 run's), and the seconds
    each stage took."""
    feats = make_features(work, target, cfg, data, aux if kind == "eagle3" else (), report, log)
    wall = {"data": data["wall_s"], "features": float(feats["wall_s"])}
    if kind == "draft-model":
        feats.pop("hidden", None)
    elif kind in ("medusa", "eagle") and "hidden" not in feats:  # (features cached by an EAGLE-3 run)
        feats["hidden"], wall["hidden"] = make_hidden(work, target, cfg, data, report, log)
    return feats, wall


def _manifest(kind: str, target: Path, tcfg: ModelConfig, cfg: TrainConfig, data: dict,
              feats: dict[str, torch.Tensor], aux: tuple[int, ...], drafter: Drafter, record: dict,
              wall: dict[str, float], total_s: float, acceptance: dict, written: Path) -> dict[str, Any]:
    """trtspec.train.json of a trained drafter: its target, data, recipe, budget, losses and acceptance."""
    module = drafter.module
    extra: dict[str, Any] = {"draft_vocab_size": len(feats["used"])}
    if kind == "eagle3":
        extra["aux_layers"] = list(aux)
    if kind == "draft-model":
        extra["draft"] = {"num_layers": cfg.draft_layers, "hidden_size": module.config.hidden_size}
    prompts = data["mode"] == "prompts"
    return manifest.new(
        manifest.TRAIN, MANIFEST_FORMAT,
        inputs={"target": {"path": str(target), **target_id(target), "num_layers": tcfg.num_layers,
                           "hidden_size": tcfg.hidden_size, "vocab_size": tcfg.vocab_size},
                "data": {"source": cfg.data, "mode": data["mode"], "items": data["train_items"],
                         "samples": len(data["samples"]), "tokens": int(len(feats["ids"])),
                         "trained_positions": int(feats["mask"].sum()), "sha256": data["sha256"],
                         "heldout_prompts": len(data["heldout"]),
                         "generated_by": "SpecEngine.generate_batch, plain decoding" if prompts else None,
                         "temperature": cfg.temperature if prompts else None}},
        outputs=manifest.file_table(written), method=kind, architecture=drafter.architecture,
        created_by=f"trtspec train {kind}", recipe=dataclasses.asdict(cfg), **extra,
        params=sum(p.numel() for p in module.parameters() if p.requires_grad),
        budget={"steps": cfg.steps, "minutes": cfg.minutes, "steps_done": record["step"],
                "epochs": record["epochs"], "wall_s": {**wall, "train": record["wall_s"], "total_this_run": total_s}},
        losses={"final_loss_ema": record["final_loss_ema"], "history": record["history"]},
        acceptance=acceptance)
