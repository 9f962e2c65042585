"""The demo family's target: a transformers LlamaForCausalLM trained here (next-token cross-entropy on random
windows of the corpus), its held-out loss, and its float16 checkpoint with the family's tokenizer files."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from trtspec.artifacts.fs import read_json, write_json
from trtspec.artifacts.hf import CONFIG, with_legacy_keys
from trtspec.train import data
from trtspec.train.demo_config import Stage
from trtspec.train.modules import Shape, forward, lm_loss
from trtspec.train.recipe import Reporter


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



def fp16_roundtrip(m: nn.Module) -> None:
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



def load_llama(path: Path):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
