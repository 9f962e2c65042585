"""Stage 2 of `trtspec train`, features: one frozen-target pass over every sample, stored once
(features.safetensors, never recomputed per epoch).

The draft vocabulary is the `draft_vocab` most frequent target ids of the trained tokens (the target's EOS
ids always in). Per token the pass keeps the target's top-k logits over the draft vocabulary and, for
EAGLE-3, the three captured layers (fp16), or for the other kinds the final (post-norm) hidden state f_t
that Medusa and EAGLE-1 read. Only when the cached features are an EAGLE-3 run's do Medusa and EAGLE-1
need one more pass for f_t (logits skipped; hidden.safetensors, keyed by the data alone).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from trtspec.artifacts.fs import digest, read_json, write_json
from trtspec.artifacts.weights import load_file, save_weights
from trtspec.train.recipe import Reporter, TrainConfig


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
                       "top_ids": top.indices[b, :n].to(torch.int32).cpu(),
                       "top_logits": top.values[b, :n].half().cpu(),
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
