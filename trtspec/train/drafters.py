"""`trtspec train eagle3`: a drafter for the user's own target, the way SpecForge / vllm-project/speculators
train EAGLE-3 heads, small enough for a CPU and a small model. Stages, each cached in the work dir (so a
killed run resumes where it stopped, `--resume`):

  1. data       prompts (a builtin set, or a .jsonl of {"prompt"} / {"messages"}) answered by the target
                itself through trtspec's runtime (SpecEngine.generate_batch, plain decoding, temperature 0.8),
                each a user turn in the chat template when the tokenizer has one; or plain text (a .txt, or
                a .jsonl of {"text"}) trained as it is. Appended to data.jsonl as it is generated.
  2. features   the draft vocabulary (the `draft_vocab` most frequent target ids of the trained tokens, the
                target's EOS ids always in), then one frozen-target pass over every sample: the three
                captured layers (fp16) and the target's top-k logits over the draft vocabulary, stored once
                in features.safetensors (never recomputed per epoch).
  3. train      the TTT loss (train/eagle3.py), AdamW, warmup + cosine, seeded batch order; a budget of
                --steps or --minutes; checkpoints (checkpoint/{head,optimizer}.safetensors + state.json,
                no pickle) every `checkpoint_s` seconds and at the end.
  4. export     fp16 head in the EAGLE-3 layout (artifacts.heads.write_eagle3) + trtspec.train.json
                (data, budget, losses, measured acceptance), written atomically into --out.
  5. measure    greedy speculative decoding through SpecEngine on held-out prompts (never trained on):
                K-token chain and a tree, tokens per verify step, acceptance rate, identity with plain.

Work dir: .trtspec/train/<out name>/ (gitignored). `trtspec models train-demo` keeps the demo family's own
recipe (train/demo.py); both share the runtime's acceptance measurement.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trtspec.artifacts import heads as layouts
from trtspec.artifacts import manifest
from trtspec.artifacts.fs import atomic_dir, digest, read_json, sha256_file, write_json
from trtspec.artifacts.hf import CONFIG, ModelConfig
from trtspec.artifacts.weights import load_file, save_weights
from trtspec.errors import ModelError, SpecError
from trtspec.train import prompts as builtin
from trtspec.train.eagle3 import Eagle3Head, ttt_loss

MANIFEST_FORMAT = 1
KINDS = ("eagle3",)
Reporter = Callable[[str, int, int, "float | None"], None]
TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]


def _silent(phase: str, step: int, total: int, loss: float | None) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data: str = "builtin:mix"
    samples: int = 512           # training samples (prompts answered, or text chunks)
    max_new_tokens: int = 192
    temperature: float = 0.8
    top_p: float = 0.95
    gen_batch: int = 16
    text_tokens: int = 256       # plain text: tokens per chunk
    draft_vocab: int = 8192
    topk: int = 32
    steps: int | None = None
    minutes: float | None = None
    ttt_steps: int = 4
    lr: float = 6e-4
    warmup: int = 40
    batch_tokens: int = 4096
    seed: int = 0
    device: str = "cpu"
    eval_prompts: int = 12
    eval_new_tokens: int = 64
    eval_k: int = 4
    intermediate_size: int | None = None  # the head's MLP (default: the target's)
    checkpoint_s: float = 120.0

    def data_key(self, target: dict[str, Any]) -> str:
        return digest({"target": target, **{k: getattr(self, k) for k in (
            "data", "max_new_tokens", "temperature", "top_p", "text_tokens", "seed")}})


# ------------------------------------------------------------------------------------------------ data


def _read_data(source: str) -> tuple[str, list[Any], list[str]]:
    """(mode "prompts" | "text", training items, held-out prompts) of --data."""
    if source.startswith("builtin:"):
        name = source.split(":", 1)[1]
        if name not in builtin.SETS:
            raise SpecError(f"--data {source}: no such builtin set", hint=f"use builtin:{' or builtin:'.join(builtin.SETS)}")
        train, held = builtin.split(builtin.prompt_set(name))
        return "prompts", train, held
    path = Path(source)
    if not path.is_file():
        raise SpecError(f"--data {source}: no such file", hint="give a .jsonl of prompts or texts, a .txt, or builtin:mix")
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
        if not isinstance(row, dict) or not any(isinstance(row.get(k), (str, list)) for k in ("prompt", "messages", "text")):
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


def _prompt_ids(tok, item) -> list[int]:
    from trtspec.artifacts.tokenizer import chat_prompt_ids

    if getattr(tok, "chat_template", None):
        return chat_prompt_ids(tok, item)
    return list(tok(item if isinstance(item, str) else item[-1]["content"])["input_ids"])


def _engine(target: Path, spec_extra: dict[str, Any], batch: int, max_in: int, max_out: int, device: str, tok):
    from trtspec.runtime import SpecEngine
    from trtspec.spec import spec_from_dict

    spec = spec_from_dict({
        "schema": 1, "model": {"name": "train", "target": str(target), "dtype": "float32"},
        "speculative": {"method": "none", **spec_extra},
        "limits": {"max_batch_size": batch, "max_input_len": max_in, "max_output_len": max_out},
        "runtime": {"kind": "torch", "device": device}})
    return SpecEngine.from_spec(spec, tokenizer=tok)


def make_data(work: Path, target: Path, cfg: TrainConfig, tok, report: Reporter, log) -> dict[str, Any]:
    """Stage 1: data.jsonl ({"ids", "prompt_len"} per sample; appended while generating, so resumable). Sample
    i is prompt order[i] of a seeded order answered with its own seed, so a longer run's first N samples are
    a shorter run's: --samples can grow (or shrink) without answering anything again."""
    import random

    from trtspec.runtime import SamplingParams

    mode, items, held = _read_data(cfg.data)
    path, meta_path = work / "data.jsonl", work / "data.json"
    key = cfg.data_key(_target_id(target))
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
        prompts = [_prompt_ids(tok, items[i]) for i in order]
        max_in = max(len(p) for p in prompts)
        engine = _engine(target, {}, cfg.gen_batch, max_in, cfg.max_new_tokens, cfg.device, tok)
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


def _target_id(target: Path) -> dict[str, Any]:
    from trtspec.artifacts.tokenizer import fingerprint

    return {"config_sha256": sha256_file(Path(target) / CONFIG), "tokenizer_sha256": fingerprint(Path(target))}


# -------------------------------------------------------------------------------------------- features


def draft_vocabulary(samples: list[dict], size: int, vocab: int, always: tuple[int, ...]) -> torch.Tensor:
    """The `size` most frequent target ids among the trained tokens (ties: lower id), `always` included;
    fewer seen tokens than `size` are filled with the lowest unseen ids (sorted: d2t's order)."""
    counts = torch.zeros(vocab, dtype=torch.long)
    for s in samples:
        ids = torch.tensor(s["ids"][max(1, s["prompt_len"]):], dtype=torch.long)
        counts += torch.bincount(ids, minlength=vocab)[:vocab]
    size = min(size, vocab)
    score = counts.double() - torch.arange(vocab, dtype=torch.double) / (2 * vocab)  # ties: lower id first
    score[list(always)] = float("inf")
    return score.topk(size).indices.sort().values


@torch.no_grad()
def make_features(work: Path, target: Path, cfg: TrainConfig, data: dict, aux: tuple[int, ...], report: Reporter,
                  log) -> dict[str, torch.Tensor]:
    """Stage 2: features.safetensors: ids [N], feats [N, 3H] fp16, top_ids [N, k] (draft ids), top_logits
    [N, k] fp16, mask [N] (token N+1 trained and the target's argmax in the draft vocabulary), offsets
    [S + 1], used [Vd] (the draft vocabulary, target ids)."""
    from trtspec.runtime.cache import chain_inputs
    from trtspec.runtime.llama import Llama

    path, meta_path = work / "features.safetensors", work / "features.json"
    key = digest({"data": data["sha256"], "aux": list(aux), "vocab": cfg.draft_vocab, "topk": cfg.topk})
    meta = read_json(meta_path)
    if meta is not None and meta.get("key") == key and path.is_file():
        log("features: cached")
        return {**load_file(path), "wall_s": torch.tensor(meta["wall_s"])}
    t0 = time.perf_counter()
    model = Llama.from_dir(target, device=cfg.device, name="target", weight_dtype=torch.float32)
    model.capture_layers = aux
    samples = data["samples"]
    used = draft_vocabulary(samples, cfg.draft_vocab, model.cfg.vocab_size, model.cfg.eos_token_ids)
    t2d = torch.zeros(model.cfg.vocab_size, dtype=torch.bool)
    t2d[used] = True
    used_dev = used.to(cfg.device)
    k = min(cfg.topk, len(used))
    out: dict[str, list[torch.Tensor]] = {n: [] for n in ("ids", "feats", "top_ids", "top_logits", "mask")}
    order = sorted(range(len(samples)), key=lambda i: len(samples[i]["ids"]))
    rows: dict[int, dict[str, torch.Tensor]] = {}
    batch = 4
    for bi in range(0, len(order), batch):
        idx = order[bi:bi + batch]
        seqs = [samples[i]["ids"] for i in idx]
        T = max(len(s) for s in seqs)
        model.set_max_seq(T + 1)
        cache = model.new_cache(len(idx), T + 1)
        tokens = torch.tensor([s + [0] * (T - len(s)) for s in seqs], device=cfg.device)
        inp = chain_inputs([0] * len(idx), T, cfg.device)
        logits, feats = model.forward(cache, inp.positions, inp.start, inp.mask, tokens=tokens)
        sub = logits.index_select(-1, used_dev)
        top = sub.topk(k, dim=-1)
        in_vocab = t2d.to(cfg.device)[logits.argmax(-1)]
        for b, i in enumerate(idx):
            n, p = len(seqs[b]), samples[i]["prompt_len"]
            trained = torch.zeros(n, dtype=torch.bool)
            trained[max(0, p - 1): n - 1] = True  # position t predicts x_{t+1}: a response token
            rows[i] = {"ids": torch.tensor(seqs[b]), "feats": feats[b, :n].half().cpu(),
                       "top_ids": top.indices[b, :n].to(torch.int32).cpu(), "top_logits": top.values[b, :n].half().cpu(),
                       "mask": trained & in_vocab[b, :n].cpu()}
        report("features", min(len(order), bi + batch), len(order), None)
    for i in range(len(samples)):
        for name in out:
            out[name].append(rows[i][name])
    lengths = torch.tensor([len(s["ids"]) for s in samples])
    t = {name: torch.cat(v) for name, v in out.items()}
    t["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    t["used"] = used
    save_weights(t, path)
    wall = round(time.perf_counter() - t0, 1)
    write_json(meta_path, {"key": key, "wall_s": wall})
    log(f"features: {len(t['ids']):,} tokens, draft vocabulary {len(used)}, in {wall:.0f}s")
    return {**t, "wall_s": torch.tensor(wall)}


# ------------------------------------------------------------------------------------------------ train


def head_config(target: ModelConfig, cfg: TrainConfig) -> ModelConfig:
    """The midlayer's shape: the target's attention and RoPE, its MLP unless set."""
    return dataclasses.replace(target, num_layers=1, intermediate_size=cfg.intermediate_size or target.intermediate_size,
                               architectures=(layouts.EAGLE3_ARCHITECTURE,), layer_types=())


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


def _gather(f: dict[str, torch.Tensor], idx: list[int], device: str) -> tuple[torch.Tensor, ...]:
    """Samples `idx` of the features, right-padded with zeros to the longest (padding carries no loss)."""
    o = f["offsets"]
    spans = [(int(o[i]), int(o[i + 1])) for i in idx]
    T = max(b - a for a, b in spans)

    def pad(name: str) -> torch.Tensor:
        src = f[name]
        out = src.new_zeros(len(spans), T, *src.shape[1:])
        for r, (a, b) in enumerate(spans):
            out[r, : b - a] = src[a:b]
        return out.to(device)

    return (pad("ids").long(), pad("feats").float(), pad("top_ids").long(), pad("top_logits").float(),
            pad("mask").bool())


def _lr(cfg: TrainConfig, step: int, total: int) -> float:
    """Linear warmup (at most a tenth of the run) then cosine down to a tenth of the peak."""
    warmup = max(1, min(cfg.warmup, total // 10))
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    p = min(1.0, (step - warmup) / max(1, total - warmup))
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def _save_checkpoint(ck: Path, head: Eagle3Head, opt: torch.optim.Optimizer, state: dict) -> None:
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


def _load_checkpoint(ck: Path, head: Eagle3Head, opt: torch.optim.Optimizer) -> dict | None:
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


def train_head(work: Path, head: Eagle3Head, f: dict[str, torch.Tensor], cfg: TrainConfig, key: str, resume: bool,
               report: Reporter, log) -> dict[str, Any]:
    """Stage 3: returns the training record (steps, wall, losses)."""
    torch.manual_seed(cfg.seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ck = work / "checkpoint"
    state = _load_checkpoint(ck, head, opt) if resume else None
    if state is not None and state.get("key") != key:
        raise SpecError(f"--resume: the checkpoint in {ck} is of another run (data, head or recipe differ)",
                        hint="run without --resume to start afresh")
    if state is None:
        state = {"key": key, "step": 0, "wall_s": 0.0, "total": cfg.steps, "history": []}
    per_epoch = len(_batches(f["offsets"], cfg.batch_tokens, cfg.seed, 0))
    t_start, t_saved = time.perf_counter() - state["wall_s"], time.perf_counter()
    ema = None
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
        ids, feats, top_ids, top_logits, mask = _gather(f, idx, cfg.device)
        for g in opt.param_groups:
            g["lr"] = _lr(cfg, step, total)
        loss, losses, accs = ttt_loss(head, ids, feats, top_ids, top_logits, mask, cfg.ttt_steps)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        lv = float(loss.detach())
        ema = lv if ema is None else 0.95 * ema + 0.05 * lv
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


# ------------------------------------------------------------------------------------------- the driver


def default_out(target: Path) -> Path:
    return Path(target).parent / f"{Path(target).name}-eagle3"


def train_eagle3(target: Path, out: Path, cfg: TrainConfig, *, resume: bool = False, work: Path | None = None,
                 report: Reporter = _silent, log: Callable[[str], None] = lambda s: None,
                 until: str | None = None) -> dict[str, Any] | None:
    """Train an EAGLE-3 head for the checkpoint `target` into `out` (replaced atomically); returns its manifest.
    `until` = "data" | "features": stop after that stage (cached in the work dir; None returned), so that a
    shared machine can run the stages as separate bounded jobs."""
    from trtspec.artifacts.tokenizer import load_tokenizer

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
    feats = make_features(work, target, cfg, data, aux, report, log)
    if until == "features":
        return None
    layer = head_config(tcfg, cfg)
    embed = load_file_tensor(target, "embed_tokens.weight")
    torch.manual_seed(cfg.seed)  # the head's initialisation
    head = Eagle3Head(layer, tcfg.hidden_size, feats["used"], embed,
                      max_positions=int((feats["offsets"][1:] - feats["offsets"][:-1]).max()) + 16).to(cfg.device)
    key = digest({"data": data["sha256"], "aux": list(aux), "vocab": len(feats["used"]),
                  "recipe": {k: v for k, v in dataclasses.asdict(cfg).items()
                             if k not in ("steps", "minutes", "device", "checkpoint_s", "eval_prompts", "eval_new_tokens")}})
    record = train_head(work, head, feats, cfg, key, resume, report, log)
    raw = layouts.eagle3_raw_config(
        _layer_keys(layer), vocab_size=tcfg.vocab_size, draft_vocab_size=head.draft_vocab_size,
        target_hidden_size=tcfg.hidden_size, aux_layers=aux, torch_dtype="float16")
    with atomic_dir(out) as tmp:
        tensors = {k: (v.half() if v.is_floating_point() else v).cpu() for k, v in head.layout_tensors().items()}
        layouts.write_eagle3(tmp, tensors, raw)
        acceptance = measure(tmp, target, tok, data["heldout"], cfg, report)
        record_m = manifest.new(
            manifest.TRAIN, MANIFEST_FORMAT,
            inputs={"target": {"path": str(target), **_target_id(target), "num_layers": tcfg.num_layers,
                               "hidden_size": tcfg.hidden_size, "vocab_size": tcfg.vocab_size},
                    "data": {"source": cfg.data, "mode": data["mode"], "items": data["train_items"],
                             "samples": len(data["samples"]), "tokens": int(len(feats["ids"])),
                             "trained_positions": int(feats["mask"].sum()), "sha256": data["sha256"],
                             "heldout_prompts": len(data["heldout"]),
                             "generated_by": "SpecEngine.generate_batch, plain decoding" if data["mode"] == "prompts"
                             else None, "temperature": cfg.temperature if data["mode"] == "prompts" else None}},
            outputs=manifest.file_table(tmp), method="eagle3", architecture=layouts.EAGLE3_ARCHITECTURE,
            created_by="trtspec train eagle3", recipe=dataclasses.asdict(cfg),
            draft_vocab_size=head.draft_vocab_size, aux_layers=list(aux),
            params=sum(p.numel() for p in head.parameters()),
            budget={"steps": cfg.steps, "minutes": cfg.minutes, "steps_done": record["step"],
                    "epochs": record["epochs"], "wall_s": {"data": data["wall_s"], "features": float(feats["wall_s"]),
                                                           "train": record["wall_s"],
                                                           "total_this_run": round(time.perf_counter() - t0, 1)}},
            losses={"final_loss_ema": record["final_loss_ema"], "history": record["history"]},
            acceptance=acceptance)
        manifest.write(tmp / manifest.FILE_NAMES[manifest.TRAIN], record_m)
    return record_m


def load_file_tensor(ckpt: Path, suffix: str) -> torch.Tensor:
    from trtspec.artifacts.weights import load_weights

    w = load_weights(ckpt)
    for name in (suffix, f"model.{suffix}"):
        if name in w:
            return w[name]
    raise ModelError(f"{ckpt}: no {suffix}", hint="the EAGLE-3 head reuses the target's embedding")


def _layer_keys(c: ModelConfig) -> dict[str, Any]:
    keys = {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "hidden_act": c.hidden_act,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
            "max_position_embeddings": c.max_position_embeddings, "attention_bias": False, "mlp_bias": False}
    if c.rope_scaling:
        keys["rope_scaling"] = dict(c.rope_scaling)
    if c.bos_token_id is not None:
        keys["bos_token_id"] = c.bos_token_id
    if c.eos_token_ids:
        keys["eos_token_id"] = list(c.eos_token_ids) if len(c.eos_token_ids) > 1 else c.eos_token_ids[0]
    return keys


@torch.no_grad()
def measure(heads: Path, target: Path, tok, heldout: list, cfg: TrainConfig, report: Reporter = _silent) -> dict:
    """Greedy decoding of held-out prompts through SpecEngine: plain, the K chain and the TREE, fixed K
    (adaptive off), fp32 drafter weights. tokens_per_step = tokens of verify steps / verify steps."""
    import os

    from trtspec.runtime import SamplingParams

    prompts = [_prompt_ids(tok, p) for p in heldout[: cfg.eval_prompts]]
    if not prompts:
        return {"prompts": 0, "note": "no held-out prompts (plain-text data)"}
    n = cfg.eval_new_tokens
    before = os.environ.get("TRTSPEC_DRAFT_DTYPE")
    os.environ["TRTSPEC_DRAFT_DTYPE"] = "float32"
    out: dict[str, Any] = {"prompts": len(prompts), "new_tokens": n, "what": "greedy, batch 1, fixed K, held-out prompts"}
    try:
        plans = {"chain": ({"num_draft_tokens": cfg.eval_k}, cfg.eval_k),
                 "tree": ({"num_draft_tokens": len(TREE), "choices": TREE}, len(TREE))}
        reference = None
        for i, (name, (extra, k)) in enumerate(plans.items()):
            engine = _engine(target, {"method": "eagle", "heads": str(Path(heads).resolve()),
                                      "adaptive": {"enabled": False}, **extra},
                             1, max(len(p) for p in prompts), n, cfg.device, tok)
            try:
                if reference is None:
                    reference = [engine.generate(p, SamplingParams(max_new_tokens=n, num_draft_tokens=0)).tokens
                                 for p in prompts]
                res = [engine.generate(p, SamplingParams(max_new_tokens=n, num_draft_tokens=k)) for p in prompts]
            finally:
                engine.close()
            steps = sum(r.steps for r in res)
            drafted, accepted = sum(r.drafted for r in res), sum(r.accepted for r in res)
            out[name] = {"k": k, "tokens_per_step": round(sum(len(r.tokens) - 1 for r in res) / max(1, steps), 3),
                         "acceptance_rate": round(accepted / max(1, drafted), 3),
                         "matches_plain_greedy": f"{sum(r.tokens == t for r, t in zip(res, reference))}/{len(res)}"}
            report("measure", i + 1, len(plans), None)
    finally:
        if before is None:
            os.environ.pop("TRTSPEC_DRAFT_DTYPE", None)
        else:
            os.environ["TRTSPEC_DRAFT_DTYPE"] = before
    return out
