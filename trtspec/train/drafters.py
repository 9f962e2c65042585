"""`trtspec train eagle3|eagle|medusa|draft-model`: a drafter for the user's own target, the way SpecForge /
vllm-project/speculators train EAGLE-3 heads, small enough for a CPU and a small model. Every kind runs the
same stages on the same cached data (one work dir can serve all four: `--work`); each stage is cached in the
work dir (so a killed run resumes where it stopped, `--resume`):

  1. data       prompts (a builtin set, or a .jsonl of {"prompt"} / {"messages"}) answered by the target
                itself through trtspec's runtime (SpecEngine.generate_batch, plain decoding, temperature 0.8),
                each a user turn in the chat template when the tokenizer has one; or plain text (a .txt, or
                a .jsonl of {"text"}) trained as it is. Appended to data.jsonl as it is generated.
  2. features   the draft vocabulary (the `draft_vocab` most frequent target ids of the trained tokens, the
                target's EOS ids always in), then one frozen-target pass over every sample: the target's
                top-k logits over the draft vocabulary and, for EAGLE-3, the three captured layers (fp16),
                or for the other kinds the final (post-norm) hidden state f_t that Medusa and EAGLE-1 read,
                stored once in features.safetensors (never recomputed per epoch). Only when the cached
                features are an EAGLE-3 run's do Medusa and EAGLE-1 need one more pass for f_t (logits
                skipped; hidden.safetensors, keyed by the data alone).
  3. train      per kind (AdamW, warmup + cosine, seeded batch order; a budget of --steps or --minutes;
                checkpoints `checkpoint[-kind]/{head,optimizer}.safetensors` + state.json, no pickle, every
                `checkpoint_s` seconds and at the end). Every loss is a soft cross-entropy against the
                target's top-k over the draft vocabulary (positions whose target argmax lies outside it are
                left out), so that all kinds learn from the very same teacher rows:
                  eagle3       the TTT loss (train/eagle3.py)
                  eagle        EAGLE-1: smooth-L1(f^_{t+1}, f_{t+1}) + 0.1 soft-CE(L f^_{t+1}), inputs
                               (E[x_{t+1}], f_t + uniform noise); L = the target's lm_head, frozen
                  medusa       head h at t against the teacher at t+1+h (0.8^h); the residual blocks train,
                               and the lm_head rows of the draft vocabulary (initialised from the target's;
                               the other rows stay the target's)
                  draft-model  a small Llama (--draft-layers/--draft-hidden; the target's vocabulary and
                               tokenizer, embeddings and lm_head initialised from the target's when the
                               widths agree) on full-vocabulary logits against the same teacher rows
  4. export     fp16 weights in the layout the method loads (artifacts.heads.write_eagle3 / write_eagle /
                write_medusa, a LlamaForCausalLM dir for draft-model) + trtspec.train.json (data, budget,
                losses, measured acceptance), written atomically into --out.
  5. measure    greedy speculative decoding through SpecEngine on held-out prompts (never trained on):
                K-token chain and a tree, tokens per verify step, acceptance rate, identity with plain.

Work dir: .trtspec/train/<out name>/ (gitignored); pass the same --work (and --draft-vocab) to train another
kind on an existing run's data and features. `trtspec models train-demo` is one use of it (train/demo.py:
it trains its own target first, then its draft-model, Medusa and EAGLE-1 drafters here, on plain text of its
corpus' training split).
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
KINDS = ("eagle3", "eagle", "medusa", "draft-model")
METHOD = {"eagle3": "eagle", "eagle": "eagle", "medusa": "medusa", "draft-model": "draft-model"}  # what serves it
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
    medusa_heads: int = 4
    noise: float = 0.1           # EAGLE-1: uniform noise on the input features
    draft_layers: int = 2        # draft-model: decoder layers
    draft_hidden: int | None = None  # draft-model: width (default: the target's; heads scaled alike)

    def recipe(self, kind: str) -> dict[str, Any]:
        """The fields a `kind` run's weights depend on (the checkpoint key): not the budget, the device or
        the measurement, nor another kind's options (so an older eagle3 checkpoint still resumes)."""
        run = ("steps", "minutes", "device", "checkpoint_s", "eval_prompts", "eval_new_tokens")
        own = {"eagle3": ("ttt_steps", "intermediate_size"), "eagle": ("noise", "intermediate_size"),
               "medusa": ("medusa_heads",), "draft-model": ("draft_layers", "draft_hidden")}
        other = {f for k, fs in own.items() if k != kind for f in fs} - set(own[kind])
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in run and k not in other}

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
    """Stage 2: features.safetensors: ids [N], feats [N, 3H] fp16 (the `aux` layers side by side: EAGLE-3's
    input) or, with no `aux`, hidden [N, H] fp16 (the final post-norm hidden state, what Medusa and EAGLE-1 heads
    read: the same pass, so they need no second one), top_ids [N, k] (draft ids), top_logits [N, k] fp16, mask
    [N] (token N+1 trained and the target's argmax in the draft vocabulary), offsets [S + 1], used [Vd] (the
    draft vocabulary, target ids). Without `aux` any cached features of the same data serve (their captured
    layers are dropped): the other kinds never store the 3 x hidden fp16 per token (3.4 KB on SmolLM2) that
    only EAGLE-3 reads."""
    from trtspec.runtime.llama import Llama

    path, meta_path = work / "features.safetensors", work / "features.json"
    fields = {"data": data["sha256"], "vocab": cfg.draft_vocab, "topk": cfg.topk}
    base, key = digest(fields), digest({**fields, "aux": list(aux)})  # (digest sorts keys: the key is as before)
    meta = read_json(meta_path)
    if meta is not None and path.is_file() and (meta.get("key") == key or (not aux and meta.get("base") == base)):
        log("features: cached")
        cached = load_file(path)
        if not aux:
            cached.pop("feats", None)
        return {**cached, "wall_s": torch.tensor(meta["wall_s"])}
    t0 = time.perf_counter()
    model = Llama.from_dir(target, device=cfg.device, name="target", weight_dtype=torch.float32)
    model.capture_layers = aux
    samples = data["samples"]
    used = draft_vocabulary(samples, cfg.draft_vocab, model.cfg.vocab_size, model.cfg.eos_token_ids)
    t2d = torch.zeros(model.cfg.vocab_size, dtype=torch.bool)
    t2d[used] = True
    used_dev = used.to(cfg.device)
    k = min(cfg.topk, len(used))
    layers = "feats" if aux else "hidden"
    out: dict[str, list[torch.Tensor]] = {n: [] for n in ("ids", layers, "top_ids", "top_logits", "mask")}
    rows: dict[int, dict[str, torch.Tensor]] = {}
    for idx, seqs, logits, feats in _full_passes(model, samples, cfg.device, "features", report):
        sub = logits.index_select(-1, used_dev)
        top = sub.topk(k, dim=-1)
        in_vocab = t2d.to(cfg.device)[logits.argmax(-1)]
        for b, i in enumerate(idx):
            n, p = len(seqs[b]), samples[i]["prompt_len"]
            trained = torch.zeros(n, dtype=torch.bool)
            trained[max(0, p - 1): n - 1] = True  # position t predicts x_{t+1}: a response token
            rows[i] = {"ids": torch.tensor(seqs[b]), layers: feats[b, :n].half().cpu(),
                       "top_ids": top.indices[b, :n].to(torch.int32).cpu(), "top_logits": top.values[b, :n].half().cpu(),
                       "mask": trained & in_vocab[b, :n].cpu()}
    for i in range(len(samples)):
        for name in out:
            out[name].append(rows[i][name])
    lengths = torch.tensor([len(s["ids"]) for s in samples])
    t = {name: torch.cat(v) for name, v in out.items()}
    t["offsets"] = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    t["used"] = used
    save_weights(t, path)
    wall = round(time.perf_counter() - t0, 1)
    write_json(meta_path, {"key": key, "base": base, "wall_s": wall})
    log(f"features: {len(t['ids']):,} tokens, draft vocabulary {len(used)}, in {wall:.0f}s")
    return {**t, "wall_s": torch.tensor(wall)}


def _full_passes(model, samples: list[dict], device: str, stage: str, report: Reporter, logits: bool = True):
    """The target's full forward over every sample's ids, shortest first, 4 at a time: yields (sample indices,
    their id lists, logits | None, the forward's hidden output), reporting progress as `stage`."""
    from trtspec.runtime.cache import chain_inputs

    order = sorted(range(len(samples)), key=lambda i: len(samples[i]["ids"]))
    batch = 4
    for bi in range(0, len(order), batch):
        idx = order[bi:bi + batch]
        seqs = [samples[i]["ids"] for i in idx]
        T = max(len(s) for s in seqs)
        model.set_max_seq(T + 1)
        cache = model.new_cache(len(idx), T + 1)
        tokens = torch.tensor([s + [0] * (T - len(s)) for s in seqs], device=device)
        inp = chain_inputs([0] * len(idx), T, device)
        out, h = model.forward(cache, inp.positions, inp.start, inp.mask, tokens=tokens, logits=logits)
        yield idx, seqs, out, h
        report(stage, min(len(order), bi + batch), len(order), None)


@torch.no_grad()
def make_hidden(work: Path, target: Path, cfg: TrainConfig, data: dict, report: Reporter,
                log) -> tuple[torch.Tensor, float]:
    """Stage 2b (Medusa, EAGLE-1, when the cached features are an EAGLE-3 run's, which hold no final hidden
    states): hidden.safetensors: the target's final post-norm hidden state [N, H] fp16 of every token (the rows
    of features.safetensors), what those heads read at serving; keyed by the data.
    Returns (the states, the seconds the pass took when it ran)."""
    from trtspec.runtime.llama import Llama

    path, meta_path = work / "hidden.safetensors", work / "hidden.json"
    key = digest({"data": data["sha256"], "what": "final post-norm hidden"})
    meta = read_json(meta_path)
    if meta is not None and meta.get("key") == key and path.is_file():
        log("hidden states: cached")
        return load_file(path)["hidden"], float(meta["wall_s"])
    t0 = time.perf_counter()
    model = Llama.from_dir(target, device=cfg.device, name="target", weight_dtype=torch.float32)
    samples = data["samples"]
    rows: dict[int, torch.Tensor] = {}
    for idx, seqs, _, h in _full_passes(model, samples, cfg.device, "hidden", report, logits=False):
        for b, i in enumerate(idx):
            rows[i] = h[b, :len(seqs[b])].half().cpu()
    out = torch.cat([rows[i] for i in range(len(samples))])
    save_weights({"hidden": out}, path)
    wall = round(time.perf_counter() - t0, 3)
    write_json(meta_path, {"key": key, "wall_s": wall})
    log(f"hidden states: {len(out):,} tokens in {wall:.0f}s")
    return out, wall


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


Loss = Callable[[torch.nn.Module, dict[str, torch.Tensor], int], tuple[torch.Tensor, list[float], list[float]]]


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
               resume: bool, report: Reporter, log, loss_fn: Loss | None = None,
               checkpoint: str = "checkpoint") -> dict[str, Any]:
    """Stage 3: returns the training record (steps, wall, losses). loss_fn(module, batch, step) ->
    (loss, per-part losses, per-part top-1 agreement); default the EAGLE-3 TTT loss."""
    if loss_fn is None:
        def loss_fn(m, b, step):
            return ttt_loss(m, b["ids"], b["feats"], b["top_ids"], b["top_logits"], b["mask"], cfg.ttt_steps)
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


# ------------------------------------------------------------------------------------------- the driver


def default_out(target: Path, kind: str = "eagle3") -> Path:
    return Path(target).parent / f"{Path(target).name}-{kind}"


def _soft_ce(logq: torch.Tensor, top_ids: torch.Tensor, top_logits: torch.Tensor,
             mask: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Masked mean soft cross-entropy of log-probs logq [B, T, V'] against the teacher's top-k (ids into V'),
    and the top-1 agreement with the teacher's argmax."""
    p = torch.softmax(top_logits.float(), -1)
    ce = -(p * logq.gather(-1, top_ids)).sum(-1)
    m = mask.float()
    denom = m.sum().clamp(min=1.0)
    acc = ((logq.argmax(-1) == top_ids[..., 0]).float() * m).sum() / denom
    return (ce * m).sum() / denom, float(acc)


def medusa_loss(heads, b: dict[str, torch.Tensor], decay: float = 0.8):
    """Head h at position t against the teacher's row at t+1+h (it predicts x_{t+2+h}), weighted decay^h."""
    f, T = b["hidden"], b["hidden"].shape[1]
    total, losses, accs = f.new_zeros(()), [], []
    for h in range(heads.num_heads):
        n = T - 1 - h
        if n <= 0:
            break
        logq = torch.log_softmax(heads.logits(h, f[:, :n]).float(), -1)
        loss, acc = _soft_ce(logq, b["top_ids"][:, 1 + h:], b["top_logits"][:, 1 + h:], b["mask"][:, 1 + h:])
        total = total + decay ** h * loss
        losses.append(float(loss.detach()))
        accs.append(acc)
    return total, losses, accs


def eagle1_loss(head, lm: torch.Tensor, embed: torch.Tensor, b: dict[str, torch.Tensor], noise: float,
                gen: torch.Generator, logit_weight: float = 0.1):
    """EAGLE-1: (E[x_{t+1}], f_t + U(-noise, noise)) -> f^_{t+1}; smooth-L1 to f_{t+1} + 0.1 soft-CE of
    lm f^_{t+1} (lm: the target's lm_head rows of the draft vocabulary) against the teacher at t+1."""
    import torch.nn.functional as F

    f, ids, m = b["hidden"], b["ids"], b["mask"][:, 1:]
    if f.shape[1] < 2:
        return f.new_zeros((), requires_grad=True), [], []
    x = f[:, :-1] + (torch.rand(f[:, :-1].shape, generator=gen) - 0.5).to(f.device) * 2 * noise
    pred = head(F.embedding(ids[:, 1:], embed), x)
    reg = F.smooth_l1_loss(pred, f[:, 1:], reduction="none").mean(-1)
    reg = (reg * m.float()).sum() / m.float().sum().clamp(min=1.0)
    logq = torch.log_softmax((pred @ lm.T).float(), -1)
    ce, acc = _soft_ce(logq, b["top_ids"][:, 1:], b["top_logits"][:, 1:], m)
    return reg + logit_weight * ce, [float(reg.detach()), float(ce.detach())], [acc]


def draft_loss(model, b: dict[str, torch.Tensor], used: torch.Tensor):
    """A draft LM's full-vocabulary logits at t against the teacher's row at t (mapped to target ids)."""
    logits = model(input_ids=b["ids"], use_cache=False).logits
    logq = torch.log_softmax(logits.float(), -1)
    loss, acc = _soft_ce(logq, used[b["top_ids"]], b["top_logits"], b["mask"])
    return loss, [float(loss.detach())], [acc]


def draft_config(t: ModelConfig, cfg: TrainConfig) -> ModelConfig:
    """The distilled draft's shape: the target's vocabulary, RoPE and special ids; `draft_layers` layers of
    width `draft_hidden` (heads scaled by the width, head_dim kept), untied; a Llama."""
    H = cfg.draft_hidden or t.hidden_size
    heads = max(1, round(t.num_heads * H / t.hidden_size))
    kv = max(1, min(heads, round(t.num_kv_heads * H / t.hidden_size)))
    while heads % kv:
        kv -= 1
    return dataclasses.replace(
        t, model_type="llama", architectures=("LlamaForCausalLM",), num_layers=cfg.draft_layers, hidden_size=H,
        intermediate_size=max(8, round(t.intermediate_size * H / t.hidden_size)), num_heads=heads,
        num_kv_heads=kv, head_dim=t.head_dim if heads * t.head_dim == H else H // heads,
        tie_word_embeddings=False, layer_types=(), sliding_window=None, torch_dtype="float16")


def _target_lm_head(target: Path, tcfg: ModelConfig) -> torch.Tensor:
    from trtspec.artifacts.weights import load_weights

    w = load_weights(target)
    for name in ("lm_head.weight", "model.lm_head.weight"):
        if name in w and not tcfg.tie_word_embeddings:
            return w[name].float()
    return load_file_tensor(target, "embed_tokens.weight").float()


def _copy_tokenizer(target: Path, out: Path) -> None:
    """The target's tokenizer files beside a draft (the draft-model method wants the same tokenizer)."""
    import shutil

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                 "tokenizer.model", "chat_template.jinja", "generation_config.json"):
        if (Path(target) / name).is_file():
            shutil.copyfile(Path(target) / name, Path(out) / name)


def _build(kind: str, target: Path, tcfg: ModelConfig, cfg: TrainConfig, feats: dict[str, torch.Tensor],
           target_name: str | None = None):
    """(module to train, its loss, a writer of its layout into a dir, its layout's architecture).
    target_name: the base_model_name_or_path the head configs record (default: the target path as given)."""
    base = target_name or str(target)
    from trtspec.train.heads import EagleHead, VocabMedusa

    used = feats["used"].to(cfg.device)
    torch.manual_seed(cfg.seed)  # the module's initialisation
    if kind == "eagle3":
        layer = head_config(tcfg, cfg)
        embed = load_file_tensor(target, "embed_tokens.weight")
        head = Eagle3Head(layer, tcfg.hidden_size, feats["used"], embed,
                          max_positions=int((feats["offsets"][1:] - feats["offsets"][:-1]).max()) + 16).to(cfg.device)
        aux = layouts.default_aux_layers(tcfg.num_layers)

        def write(d: Path) -> None:
            raw = layouts.eagle3_raw_config(
                _layer_keys(layer), vocab_size=tcfg.vocab_size, draft_vocab_size=head.draft_vocab_size,
                target_hidden_size=tcfg.hidden_size, aux_layers=aux, torch_dtype="float16")
            layouts.write_eagle3(d, {k: (v.half() if v.is_floating_point() else v).cpu()
                                     for k, v in head.layout_tensors().items()}, raw)
        return head, None, write, layouts.EAGLE3_ARCHITECTURE
    lm = _target_lm_head(target, tcfg)
    if kind == "medusa":
        heads = VocabMedusa(tcfg.hidden_size, lm[feats["used"]], cfg.medusa_heads).to(cfg.device)

        def write(d: Path) -> None:
            layouts.write_medusa(d, {k: v.half().cpu() for k, v in heads.layout_tensors(lm, feats["used"]).items()},
                                 hidden_size=tcfg.hidden_size, vocab_size=tcfg.vocab_size, num_layers=1,
                                 base_model_name_or_path=base)
        return heads, lambda m, b, step: medusa_loss(m, b), write, "MedusaHeads"
    if kind == "eagle":
        layer = dataclasses.replace(head_config(tcfg, cfg), architectures=("LlamaForCausalLM",), model_type="llama",
                                    tie_word_embeddings=False, sliding_window=None, torch_dtype="float16")
        head = EagleHead(layer).to(cfg.device)
        embed = load_file_tensor(target, "embed_tokens.weight").float().to(cfg.device)
        lm_used = lm[feats["used"]].to(cfg.device)

        def loss(m, b, step):
            gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)  # resumable: noise per step
            return eagle1_loss(m, lm_used, embed, b, cfg.noise, gen)

        return head, loss, lambda d: write_eagle1(d, head, layer, base), "LlamaForCausalLM (EAGLE-1 head)"
    if kind == "draft-model":
        from transformers import LlamaForCausalLM

        from trtspec.artifacts.hf import with_legacy_keys

        dc = draft_config(tcfg, cfg)
        hf = dc.to_hf()
        hf._attn_implementation = "sdpa"
        model = LlamaForCausalLM(hf)
        with torch.no_grad():
            if dc.hidden_size == tcfg.hidden_size:  # start from the target's embeddings and LM head
                model.model.embed_tokens.weight.copy_(load_file_tensor(target, "embed_tokens.weight").float())
                model.lm_head.weight.copy_(lm)
        model = model.to(cfg.device)

        def write(d: Path) -> None:
            model.to(torch.float16).save_pretrained(str(d))
            model.to(torch.float32)
            from trtspec.artifacts.fs import read_json as rj
            write_json(d / CONFIG, with_legacy_keys(rj(d / CONFIG) or {}, dc))
            _copy_tokenizer(target, d)
        return model, lambda m, b, step: draft_loss(m, b, used), write, "LlamaForCausalLM"
    raise SpecError(f"no drafter kind {kind!r}", hint=f"one of {', '.join(KINDS)}")


def write_eagle1(d: Path, head: torch.nn.Module, layer: ModelConfig, base: str) -> None:
    """An EAGLE-1 head (train.heads.EagleHead) in its layout, fp16: fc + one decoder layer, and the layer's
    config marked eagle (fc has a bias), naming its target `base`."""
    from trtspec.artifacts.hf import with_legacy_keys

    raw = {**layer.to_hf_dict(), "eagle": True, "bias": True, "base_model_name_or_path": base}
    layouts.write_eagle(d, {k: v.detach().half().cpu() for k, v in head.state_dict().items()},
                        with_legacy_keys(raw, layer))


def train_eagle3(target: Path, out: Path, cfg: TrainConfig, **kw) -> dict[str, Any] | None:
    """Train an EAGLE-3 head (train_drafter("eagle3", ...))."""
    return train_drafter("eagle3", target, out, cfg, **kw)


def train_drafter(kind: str, target: Path, out: Path, cfg: TrainConfig, *, resume: bool = False,
                  work: Path | None = None, report: Reporter = _silent, log: Callable[[str], None] = lambda s: None,
                  until: str | None = None, target_name: str | None = None) -> dict[str, Any] | None:
    """Train a `kind` drafter for the checkpoint `target` into `out` (replaced atomically); returns its
    manifest. `until` = "data" | "features": stop after that stage (cached in the work dir; None returned),
    so that a shared machine can run the stages as separate bounded jobs. `target_name`: how the heads'
    configs name the target (base_model_name_or_path; the demo family's say "../target", its sibling)."""
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
    feats = make_features(work, target, cfg, data, aux if kind == "eagle3" else (), report, log)  # layers: EAGLE-3's
    wall = {"data": data["wall_s"], "features": float(feats["wall_s"])}
    if kind == "draft-model":
        feats.pop("hidden", None)
    elif kind in ("medusa", "eagle") and "hidden" not in feats:  # (features cached by an EAGLE-3 run)
        feats["hidden"], wall["hidden"] = make_hidden(work, target, cfg, data, report, log)
    if until == "features":
        return None
    module, loss_fn, write, architecture = _build(kind, target, tcfg, cfg, feats, target_name)
    key = digest({"data": data["sha256"], "aux": list(aux), "vocab": len(feats["used"]), "recipe": cfg.recipe(kind),
                  **({"kind": kind} if kind != "eagle3" else {})})
    record = train_head(work, module, feats, cfg, key, resume, report, log, loss_fn,
                        "checkpoint" if kind == "eagle3" else f"checkpoint-{kind}")
    module.eval()
    extra: dict[str, Any] = {"draft_vocab_size": len(feats["used"])}
    if kind == "eagle3":
        extra["aux_layers"] = list(aux)
    if kind == "draft-model":
        extra["draft"] = {"num_layers": cfg.draft_layers, "hidden_size": module.config.hidden_size}
    with atomic_dir(out) as tmp:
        write(tmp)
        acceptance = measure(tmp, target, tok, data["heldout"], cfg, report, method=METHOD[kind])
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
            outputs=manifest.file_table(tmp), method=kind, architecture=architecture,
            created_by=f"trtspec train {kind}", recipe=dataclasses.asdict(cfg), **extra,
            params=sum(p.numel() for p in module.parameters() if p.requires_grad),
            budget={"steps": cfg.steps, "minutes": cfg.minutes, "steps_done": record["step"],
                    "epochs": record["epochs"], "wall_s": {**wall, "train": record["wall_s"],
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
def measure(heads: Path, target: Path, tok, heldout: list, cfg: TrainConfig, report: Reporter = _silent,
            method: str = "eagle") -> dict:
    """Greedy decoding of held-out prompts through SpecEngine: plain, the K chain and the TREE (heads only),
    fixed K (adaptive off), fp32 drafter weights. tokens_per_step = tokens of verify steps / verify steps."""
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
        from trtspec import methods

        weights = methods.get(method).weights  # the spec key of its files: "draft" or "heads"
        plans = {"chain": ({"num_draft_tokens": cfg.eval_k}, cfg.eval_k)}
        if weights == "heads":
            plans["tree"] = ({"num_draft_tokens": len(TREE), "choices": TREE}, len(TREE))
        where = {weights: str(Path(heads).resolve())}
        reference = None
        for i, (name, (extra, k)) in enumerate(plans.items()):
            engine = _engine(target, {"method": method, **where, "adaptive": {"enabled": False}, **extra},
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
