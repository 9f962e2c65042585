"""Stage 3 of `trtspec train`, the training loop every kind shares: AdamW, linear warmup then cosine, a
seeded batch order (consecutive samples up to a token budget), a budget of steps or minutes, and
checkpoints (`head.safetensors`, `optimizer.safetensors` and `state.json`: no pickle) every `checkpoint_s`
seconds and at the end, so that a killed run resumes to the weights of an uninterrupted one.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trtspec.artifacts.fs import read_json, write_json
from trtspec.artifacts.weights import load_file, save_weights
from trtspec.errors import SpecError
from trtspec.train.recipe import Reporter, TrainConfig

# (module, batch, step) -> (loss, per-part losses, per-part top-1 agreement with the teacher)
Loss = Callable[[torch.nn.Module, dict[str, torch.Tensor], int], tuple[torch.Tensor, list[float], list[float]]]


def _batches(offsets: torch.Tensor, budget: int, seed: int, epoch: int) -> list[list[int]]:
    """One epoch's batches: a seeded order, consecutive samples while B * longest <= budget tokens."""
    n = len(offsets) - 1
    lengths = (offsets[1:] - offsets[:-1]).tolist()
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch)).tolist()
    out, cur, longest = [], [], 0
    for i in order:
        L = max(longest, lengths[i])
        if cur and L * (len(cur) + 1) > budget:
            out.append(cur)
            cur, L = [], lengths[i]
        cur.append(i)
        longest = L
    if cur:
        out.append(cur)
    return out


def _gather(f: dict[str, torch.Tensor], idx: list[int], device: str) -> dict[str, torch.Tensor]:
    """Samples `idx` of the features (every per-token row tensor), right-padded with zeros to the longest
    (padding carries no loss): ids, top_ids long; mask bool; the rest float32."""
    o = f["offsets"]
    spans = [(int(o[i]), int(o[i + 1])) for i in idx]
    T = max(b - a for a, b in spans)

    def pad(name: str) -> torch.Tensor:
        src = f[name]
        out = src.new_zeros(len(spans), T, *src.shape[1:])
        for r, (a, b) in enumerate(spans):
            out[r, : b - a] = src[a:b]
        out = out.to(device)
        return out.long() if name in ("ids", "top_ids") else out.bool() if name == "mask" else out.float()

    return {name: pad(name) for name in ("ids", "feats", "top_ids", "top_logits", "mask", "hidden") if name in f}


def _lr(cfg: TrainConfig, step: int, total: int) -> float:
    """Linear warmup (at most a tenth of the run) then cosine down to a tenth of the peak."""
    warmup = max(1, min(cfg.warmup, total // 10))
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def _save_checkpoint(ck: Path, head: torch.nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
    """head + AdamW moments as safetensors, the rest as JSON (no pickle); written beside, then renamed."""
    ck.mkdir(parents=True, exist_ok=True)
    names = {p: n for n, p in head.named_parameters()}
    moments = {}
    for p, s in opt.state.items():
        for k in ("exp_avg", "exp_avg_sq"):
            moments[f"{names[p]}.{k}"] = s[k]
        moments[f"{names[p]}.step"] = torch.as_tensor(s["step"], dtype=torch.float32).reshape(1)
    save_weights({k: v.detach() for k, v in head.state_dict().items()}, ck / "head.safetensors.tmp")
    save_weights(moments, ck / "optimizer.safetensors.tmp")
    (ck / "head.safetensors.tmp").replace(ck / "head.safetensors")
    (ck / "optimizer.safetensors.tmp").replace(ck / "optimizer.safetensors")
    write_json(ck / "state.json", state)


def _load_checkpoint(ck: Path, head: torch.nn.Module, opt: torch.optim.Optimizer) -> dict | None:
    state = read_json(ck / "state.json")
    if state is None or not (ck / "head.safetensors").is_file() or not (ck / "optimizer.safetensors").is_file():
        return None
    head.load_state_dict(load_file(ck / "head.safetensors"))
    m = load_file(ck / "optimizer.safetensors")
    for n, p in head.named_parameters():
        if f"{n}.exp_avg" in m:
            opt.state[p] = {"step": m[f"{n}.step"].reshape(()), "exp_avg": m[f"{n}.exp_avg"].to(p.device),
                            "exp_avg_sq": m[f"{n}.exp_avg_sq"].to(p.device)}
    return state


def _extend(state: dict, cfg: TrainConfig) -> None:
    """--resume with a larger budget than the checkpoint's run had: the schedule's length grows to it (the
    cosine is stretched from where it stands, so the learning rate rises back a little)."""
    step, wall = state["step"], state["wall_s"]
    if cfg.steps is not None and cfg.steps > (state["total"] or 0):
        state["total"] = cfg.steps
    elif (cfg.minutes is not None and cfg.minutes > (state.get("minutes") or 0) and state["total"] is not None
          and step > 0):  # the same --minutes resumes the same schedule; more minutes stretch it
        state["total"] = max(state["total"], step + 1, int(cfg.minutes * 60 / (wall / step)))
    state["minutes"] = cfg.minutes if cfg.minutes is not None else state.get("minutes")


def train_head(work: Path, head: torch.nn.Module, f: dict[str, torch.Tensor], cfg: TrainConfig, key: str,
               resume: bool, report: Reporter, log, loss_fn: Loss, checkpoint: str = "checkpoint") -> dict[str, Any]:
    """Train `head` on the features `f` with `loss_fn` (see Loss) until the budget is spent, checkpointing into
    `work / checkpoint` (resumed with `resume` when its `key` matches); returns the training record (steps,
    wall, losses)."""
    torch.manual_seed(cfg.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ck = work / checkpoint
    state = _load_checkpoint(ck, head, opt) if resume else None
    if state is not None and state.get("key") != key:
        raise SpecError(f"--resume: the checkpoint in {ck} is of another run (data, head or recipe differ)",
                        hint="run without --resume to start afresh")
    if state is None:
        state = {"key": key, "step": 0, "wall_s": 0.0, "total": cfg.steps, "minutes": cfg.minutes, "history": []}
    else:
        _extend(state, cfg)
    per_epoch = len(_batches(f["offsets"], cfg.batch_tokens, cfg.seed, 0))
    t_start, t_saved = time.perf_counter() - state["wall_s"], time.perf_counter()
    ema = state.get("loss_ema")  # a resumed run continues its average (None before the first step)
    head.train()
    while True:
        step = state["step"]
        elapsed = time.perf_counter() - t_start
        if state["total"] is None and step == 10 and cfg.minutes:  # a time budget: fix the schedule's length
            state["total"] = max(step + 1, int(cfg.minutes * 60 / (elapsed / step)))
        total = state["total"] or (cfg.steps or 10 ** 9)
        if step >= total or (cfg.minutes and elapsed >= cfg.minutes * 60):
            break
        epoch, i = divmod(step, per_epoch)
        idx = _batches(f["offsets"], cfg.batch_tokens, cfg.seed, epoch)[i]
        batch = _gather(f, idx, cfg.device)
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step, total)
        loss, losses, accs = loss_fn(head, batch, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        lv = float(loss.detach())
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
        state["loss_ema"] = ema
        state["step"] = step + 1
        if step % 20 == 0 or step + 1 == total:
            state["history"].append({"step": step + 1, "loss": round(lv, 4),
                                     "step_loss": [round(x, 4) for x in losses], "top1": [round(x, 3) for x in accs]})
        report("train", step + 1, total if state["total"] else 0, ema)
        if time.perf_counter() - t_saved > cfg.checkpoint_s:
            state["wall_s"] = round(time.perf_counter() - t_start, 1)
            _save_checkpoint(ck, head, opt, state)
            t_saved = time.perf_counter()
    state["wall_s"] = round(time.perf_counter() - t_start, 1)
    _save_checkpoint(ck, head, opt, state)
    head.eval()
    log(f"train: {state['step']} steps in {state['wall_s']:.0f}s")
    return {**state, "epochs": round(state["step"] / max(1, per_epoch), 2), "batches_per_epoch": per_epoch,
            "final_loss_ema": None if ema is None else round(ema, 4)}

