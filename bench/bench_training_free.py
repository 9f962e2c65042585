"""The training-free drafters side by side: plain vs ngram vs suffix vs lookahead, in one run.

    .venv/bin/python bench/bench_training_free.py [--family smollm2|demo|both] [--prompts 4] [--new 128]
                                                  [--threads 2] [--fixed]

SmolLM2-135M-Instruct (`make smollm2`; specs examples/smollm2/{ngram,suffix,lookahead}.toml) on three prompt
sets, each prompt a user message rendered with the chat template — chat (chat.jsonl), code (code.jsonl) and
edit (edit.jsonl: rewrite or refactor a given text, where the answer copies much of the prompt) — and the
demo family (examples/demo/*.toml, held-out stdlib prompts). Batch 1, greedy, adaptive K (with its fallback)
as the specs say unless --fixed. All methods share one target and run prompt by prompt in turn, so they see
the same load. Per set and method it prints:

  tok/s      new tokens / wall time (prefill included), summed over the set
  x plain    tok/s over plain decoding's on the same set in this run (the goal: >= 0.97 everywhere)
  tok/step   new tokens per verify step;  acc: accepted / drafted tokens
  step ms    wall time per step;  x plain step: its cost over a plain step (what a branch or draft costs)
  same       outputs identical to plain greedy decoding

and the load average before and after. A script that prints tables, never a test: timings depend on the
machine and its load (run it only when nothing else runs: `uptime` below 1.5).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench._common import Meter, jsonl_prompts  # noqa: E402
from trtspec import methods  # noqa: E402
from trtspec.artifacts.tokenizer import chat_prompt_ids, load_tokenizer  # noqa: E402
from trtspec.runtime import AdaptiveConfig, Llama, SamplingParams, SpecEngine  # noqa: E402
from trtspec.check import load_spec  # noqa: E402

METHODS = ("none", "ngram", "suffix", "lookahead")
SMOL = REPO / "examples" / "smollm2"
SMOL_SETS = {"chat": SMOL / "chat.jsonl", "code": SMOL / "code.jsonl", "edit": SMOL / "edit.jsonl"}


def engines(specs: dict[str, Path], threads: int) -> tuple[dict[str, SpecEngine], object]:
    """One SpecEngine per method on ONE target (the RoPE table sized for the largest)."""
    first = load_spec(next(iter(specs.values())))
    target = Llama.from_dir(first.model.target, dtype=first.model.dtype)
    tok = load_tokenizer(first.tokenizer_dir)
    out = {}
    for name, path in specs.items():
        spec = load_spec(path)
        lim, a, m = spec.limits, spec.speculative.adaptive, methods.get(name)  # "none": the spec's, plainly
        out[name] = SpecEngine(target, m.proposer(spec, "cpu"), tok, max_batch_size=1, max_input_len=lim.max_input_len,
                               max_output_len=lim.max_output_len,
                               num_draft_tokens=spec.speculative.num_draft_tokens if m.drafts else 0,
                               adaptive=AdaptiveConfig(a.enabled, a.min_draft_tokens, a.history, a.fallback_acceptance))
    target.set_max_seq(max(e.max_seq for e in out.values()))
    torch.set_num_threads(threads)
    return out, tok


def run_sets(engs: dict[str, SpecEngine], sets: dict[str, list[list[int]]], new: int, fixed: bool):
    rows: dict[str, dict[str, Meter]] = {s: {m: Meter() for m in engs} for s in sets}
    warm = next(iter(sets.values()))[0]
    for e in engs.values():
        e.generate(warm, SamplingParams(max_new_tokens=8))
    for sname, prompts in sets.items():
        for ids in prompts:
            for mname, e in engs.items():
                k = e.k_max if fixed and e.k_max else None
                rows[sname][mname].add(e.generate(ids, SamplingParams(max_new_tokens=new, num_draft_tokens=k)))
    return rows


def show(title: str, rows: dict[str, dict[str, Meter]], before, after) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("set", "method", "tokens", "tok/s", "x plain", "tok/step", "acc", "step ms", "x plain step", "same"):
        table.add_column(col, justify="left" if col in ("set", "method") else "right")
    for sname, m in rows.items():
        plain = m["none"]
        plain_step = plain.seconds / max(plain.steps + len(plain.outputs), 1)
        for mname, x in m.items():
            steps = x.steps + len(x.outputs)  # + the prefill's token per request
            step = x.seconds / max(steps, 1)
            same = sum(a == b for a, b in zip(x.outputs, plain.outputs))
            table.add_row(sname, mname, str(x.tokens), f"{x.rate:.1f}", f"{x.rate / plain.rate:.2f}x",
                          f"{x.tokens / max(steps, 1):.2f}", f"{x.accepted / x.drafted:.2f}" if x.drafted else "-",
                          f"{1e3 * step:.1f}", f"{step / plain_step:.2f}x", f"{same}/{len(x.outputs)}")
    console = Console(width=150)
    console.print(table)
    console.print(f"load average before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, after "
                  f"{after[0]:.2f} {after[1]:.2f} {after[2]:.2f} ({os.cpu_count()} cores)")


def smollm2(args) -> None:
    specs = {"none": SMOL / "plain.toml", "ngram": SMOL / "ngram.toml", "suffix": SMOL / "suffix.toml",
             "lookahead": SMOL / "lookahead.toml"}
    if not (REPO / "examples" / "models" / "smollm2-135m-instruct" / "trtspec.import.json").is_file():
        sys.exit("error: SmolLM2 is not imported\nhint: run `make smollm2`")
    engs, tok = engines(specs, args.threads)
    sets = {name: [chat_prompt_ids(tok, p) for p in jsonl_prompts(path, args.prompts)]
            for name, path in SMOL_SETS.items()}
    before = os.getloadavg()
    rows = run_sets(engs, sets, args.new, args.fixed)
    show(f"SmolLM2-135M-Instruct, batch 1, greedy, <= {args.new} new tokens, {args.threads} threads, "
         f"{args.prompts} prompts per set, K {'fixed' if args.fixed else 'adaptive'}", rows, before, os.getloadavg())


def demo(args) -> None:
    demo_dir = REPO / "examples" / "demo"
    specs = {"none": demo_dir / "ngram.toml", "ngram": demo_dir / "ngram.toml",
             "suffix": demo_dir / "suffix.toml", "lookahead": demo_dir / "lookahead.toml"}
    engs, tok = engines(specs, args.threads)
    from trtspec.train.data import heldout_prompts

    texts = heldout_prompts(args.prompts, prompt_tokens=64, models_dir=REPO / "examples" / "models")
    sets = {"stdlib": [tok(t, add_special_tokens=False)["input_ids"] for t in texts]}
    before = os.getloadavg()
    rows = run_sets(engs, sets, args.new, args.fixed)
    show(f"demo family (stdlib-trained), batch 1, greedy, <= {args.new} new tokens, {args.threads} threads, "
         f"{args.prompts} prompts, K {'fixed' if args.fixed else 'adaptive'}", rows, before, os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", choices=("smollm2", "demo", "both"), default="both")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per set")
    ap.add_argument("--new", type=int, default=128, help="most new tokens per request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fixed", action="store_true", help="K fixed at the spec's (no adaptive K, no fallback)")
    args = ap.parse_args()
    if args.family in ("smollm2", "both"):
        smollm2(args)
    if args.family in ("demo", "both"):
        demo(args)


if __name__ == "__main__":
    main()
