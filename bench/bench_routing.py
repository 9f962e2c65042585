"""Per-request draft routing vs each single drafter, on one mixed prompt set, in one run.

    .venv/bin/python bench/bench_routing.py [--spec examples/demo/routed.toml] [--prompts 8] [--new 64]
                                            [--batch 1] [--threads 2] [--json OUT]

The routed spec's drafters each run alone (as a single-drafter spec: spec.drafter_spec) and together behind the
router, plus plain decoding, all on ONE target in one process. The prompt set interleaves the builtin code, chat
and edit prompts (`--prompts` of each, code/chat/edit/code/...), so every engine sees the same mix and, prompt by
prompt in turn, the same load. Greedy, adaptive K as the spec says; `--batch N` sends the set N prompts at a time
(generate_batch: continuous batching, all rows verified in one target pass). Per engine and per prompt class
(and over all of them) it prints:

  tok/s      new tokens / wall time (prefill included)     x plain   over plain decoding's on the same prompts
  acc        accepted / drafted tokens                     tok/step  new tokens per verify step
  same       outputs identical to plain greedy decoding    routed    (routed rows) which drafter each class got

and the load average before and after. A script that prints tables, never a test: timings depend on the machine
and its load (run it under the shared lock when nothing else runs: `uptime` below 1.5).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench._common import Meter  # noqa: E402
from trtspec import methods  # noqa: E402
from trtspec.artifacts.tokenizer import load_tokenizer  # noqa: E402
from trtspec.bench.prompts import SETS  # noqa: E402
from trtspec.check import load_spec  # noqa: E402
from trtspec.runtime import AdaptiveConfig, Llama, SamplingParams, SpecEngine  # noqa: E402
from trtspec.spec import drafter_spec  # noqa: E402

CLASSES = ("code", "chat", "edit")


def engines(spec, batch: int, threads: int) -> tuple[dict[str, SpecEngine], object]:
    """plain, each drafter alone (by its name), and "routed": one target shared by all."""
    torch.set_num_threads(threads)
    target = Llama.from_dir(spec.model.target, dtype=spec.model.dtype)
    tok = load_tokenizer(spec.tokenizer_dir)
    lim, a = spec.limits, spec.speculative.adaptive
    kw = dict(max_batch_size=batch, max_input_len=lim.max_input_len, max_output_len=lim.max_output_len,
              adaptive=AdaptiveConfig(a.enabled, a.min_draft_tokens, a.history, a.fallback_acceptance))
    out = {"plain": SpecEngine(target, methods.get("none").proposer(spec, "cpu"), tok, num_draft_tokens=0, **kw)}
    for d in spec.speculative.drafters:
        sub, m = drafter_spec(spec, d), methods.get(d.method)
        out[d.name] = SpecEngine(target, m.proposer(sub, "cpu"), tok,
                                 num_draft_tokens=d.num_draft_tokens if m.drafts else 0, **kw)
    out["routed"] = SpecEngine(target, methods.get(spec.method).proposer(spec, "cpu"), tok, num_draft_tokens=1, **kw)
    target.set_max_seq(max(e.max_seq for e in out.values()))
    return out, tok


def prompt_set(n: int, sets: str) -> list[tuple[str, str]]:
    """(class, prompt): n of each class, interleaved. "builtin": trtspec's code, chat and edit sets (short
    prompts); "stdlib": the demo family's held-out stdlib code (prompts of 128 tokens of real code: much to
    copy from) as "code", and the builtin chat prompts."""
    if sets == "stdlib":
        from trtspec.train.data import heldout_prompts

        code = heldout_prompts(n, prompt_tokens=128, models_dir=REPO / "examples" / "models")
        return [(c, code[i] if c == "code" else SETS["chat"][i % len(SETS["chat"])]) for i in range(n)
                for c in ("code", "chat")]
    return [(c, SETS[c][i % len(SETS[c])]) for i in range(n) for c in CLASSES]


def run(engs: dict[str, SpecEngine], prompts: list[tuple[str, str]], new: int, batch: int):
    meters = {e: {c: Meter() for c in (*CLASSES, "all")} for e in engs}
    routes: dict[str, dict[str, int]] = {c: {} for c in CLASSES}
    sp = SamplingParams(max_new_tokens=new)
    for e in engs.values():  # warm-up
        e.generate(prompts[0][1], SamplingParams(max_new_tokens=8))
    routed = engs["routed"]
    for c, p in prompts:
        name = routed.drafter_names[routed.route(routed._encode(p))]
        routes[c][name] = routes[c].get(name, 0) + 1
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        for ename, e in engs.items():
            t0 = time.perf_counter()
            res = e.generate_batch([p for _, p in chunk], sp)
            wall, total = time.perf_counter() - t0, sum(len(r.tokens) for r in res) or 1
            for (c, _), r in zip(chunk, res):
                # the batch's wall time, shared by its requests in proportion to their tokens (batch 1: its own)
                r = dataclasses.replace(r, seconds=wall * len(r.tokens) / total)
                meters[ename][c].add(r)
                meters[ename]["all"].add(r)
    return meters, routes


def rows(meters, routes) -> list[dict]:
    out = []
    for ename, by_class in meters.items():
        for c, m in by_class.items():
            if not m.outputs:
                continue
            plain = meters["plain"][c]
            steps = m.steps + len(m.outputs)
            out.append({"engine": ename, "class": c, "tokens": m.tokens, "tok_s": round(m.rate, 1),
                        "x_plain": round(m.rate / plain.rate, 3) if plain.rate else None,
                        "acceptance": round(m.accepted / m.drafted, 3) if m.drafted else None,
                        "tokens_per_step": round(m.tokens / max(steps, 1), 3),
                        "same": f"{sum(a == b for a, b in zip(m.outputs, plain.outputs))}/{len(m.outputs)}",
                        "routed_to": routes.get(c) if ename == "routed" else None})
    return out


def show(title: str, table_rows: list[dict], before, after) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("class", "engine", "tokens", "tok/s", "x plain", "acc", "tok/step", "same", "routed"):
        table.add_column(col, justify="left" if col in ("class", "engine", "routed") else "right")
    for c in (*CLASSES, "all"):  # (a class without prompts has no rows)
        for r in (r for r in table_rows if r["class"] == c):
            table.add_row(c, r["engine"], str(r["tokens"]), f"{r['tok_s']:.1f}", f"{r['x_plain']:.2f}x",
                          f"{r['acceptance']:.2f}" if r["acceptance"] is not None else "-",
                          f"{r['tokens_per_step']:.2f}", r["same"],
                          ", ".join(f"{k} {v}" for k, v in (r["routed_to"] or {}).items()))
    console = Console(width=150)
    console.print(table)
    console.print(f"load average before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, after "
                  f"{after[0]:.2f} {after[1]:.2f} {after[2]:.2f} ({os.cpu_count()} cores)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "demo" / "routed.toml")
    ap.add_argument("--prompts", type=int, default=8, help="prompts of each class (code, chat, edit)")
    ap.add_argument("--new", type=int, default=64, help="most new tokens per request")
    ap.add_argument("--batch", type=int, default=1, help="prompts sent together (continuous batching)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sets", choices=("builtin", "stdlib"), default="builtin",
                    help="builtin: code/chat/edit; stdlib: held-out stdlib code (demo family) and chat")
    ap.add_argument("--json", type=Path, help="write the rows as JSON")
    args = ap.parse_args()
    spec = load_spec(args.spec)
    engs, _ = engines(spec, args.batch, args.threads)
    prompts = prompt_set(args.prompts, args.sets)
    before = os.getloadavg()
    meters, routes = run(engs, prompts, args.new, args.batch)
    after = os.getloadavg()
    table_rows = rows(meters, routes)
    show(f"{spec.name}: plain vs each drafter vs routed, {len(prompts)} prompts ({args.prompts} per class, "
         f"{args.sets} sets, interleaved), batch {args.batch}, greedy, <= {args.new} new tokens, "
         f"{args.threads} threads", table_rows, before, after)
    if args.json:
        args.json.write_text(json.dumps({"spec": str(args.spec), "batch": args.batch, "new": args.new,
                                         "load_before": before, "load_after": after, "rows": table_rows}, indent=2))


if __name__ == "__main__":
    main()
