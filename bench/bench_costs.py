"""Cost-aware adaptive K against the fixed-cost policy it replaced, in one run: SmolLM2 ngram, fp32 and int8.

    .venv/bin/python bench/bench_costs.py [--prompts 4] [--new 128] [--threads 2]

Needs `make smollm2`. Per target (examples/smollm2/ngram.toml: fp32; ngram-int8.toml: weight-only int8, its own
model, compared with its own plain decoding) three runs of every prompt, in turn (the order rotates by prompt),
batch 1, greedy, each prompt a user message rendered with the chat template (examples/smollm2/{chat,code,
edit}.jsonl):

  plain     num_draft_tokens = 0
  fixed c   adaptive K as it was: every draft token priced at a fixed 0.15 of a decode step, verify rows free,
            speculation off below an acceptance of 0.2 (an injected cost table {verify: 1 everywhere, draft:
            0.15} and the floor 0.2; the one difference from the old code: probes back off exponentially)
  measured  adaptive K priced with the cost table the engine measured at load (runtime/costs.py)

It prints tok/s, the ratio to plain, tokens per step, acceptance, drafted tokens per step and outputs equal to
plain; the measured cost tables (ms and x one row) with the seconds calibration took; `lscpu`'s SIMD flags and
the load average before and after. A script that prints tables, never a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.pop("TRTSPEC_COST_TABLE", None)  # measure (the "fixed c" engine gets its table as an argument)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench._common import Meter, cpu_model, jsonl_prompts, vector_flags  # noqa: E402
from trtspec import methods  # noqa: E402
from trtspec.artifacts.tokenizer import chat_prompt_ids  # noqa: E402
from trtspec.check import load_spec  # noqa: E402
from trtspec.runtime import SamplingParams, costs  # noqa: E402
from trtspec.runtime.costs import CostTable  # noqa: E402

SMOL = REPO / "examples" / "smollm2"
TARGETS = {"fp32": SMOL / "ngram.toml", "int8": SMOL / "ngram-int8.toml"}
SETS = {"chat": SMOL / "chat.jsonl", "code": SMOL / "code.jsonl", "edit": SMOL / "edit.jsonl"}
FIXED_C = CostTable({1: 1.0, 1 << 16: 1.0}, {"*": 0.15}, "fixed c = 0.15")  # rows free: flat to 65536
RUNS = ("plain", "fixed c", "measured")


def engines(spec_path: Path):
    spec = load_spec(spec_path)
    measured = methods.engine(spec)  # measures its table at load
    t0 = time.perf_counter()
    costs.calibrate(measured, [measured.method])  # once more, timed (the engine keeps its first table)
    calibration = time.perf_counter() - t0
    fixed = methods.engine(spec, costs=FIXED_C)
    fixed.adaptive = dataclasses.replace(fixed.adaptive, fallback_acceptance=0.2)
    return {"plain": measured, "fixed c": fixed, "measured": measured}, calibration


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4, help="prompts per set")
    ap.add_argument("--new", type=int, default=128, help="most new tokens per request")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if not (REPO / "examples" / "models" / "smollm2-135m-instruct" / "trtspec.import.json").is_file():
        sys.exit("error: SmolLM2 is not imported\nhint: run `make smollm2`")
    torch.set_num_threads(args.threads)
    from rich.console import Console
    from rich.table import Table

    from trtspec.cli.status import cost_table

    console = Console(width=150)
    flags = " ".join(sorted(vector_flags(("avx", "amx", "fma", "f16c"))))
    console.print(f"CPU: {cpu_model()}; {flags}; {os.cpu_count()} cores, {args.threads} threads")
    before = os.getloadavg()
    results: dict[str, dict[str, dict[str, Meter]]] = {}
    for tname, path in TARGETS.items():
        engs, calibration = engines(path)
        tok = engs["plain"].tokenizer
        sets = {s: [chat_prompt_ids(tok, p) for p in jsonl_prompts(f, args.prompts)] for s, f in SETS.items()}
        for ids in (ids for prompts in sets.values() for ids in prompts):  # first calls of each prefill shape
            for eng in (engs["measured"], engs["fixed c"]):
                eng.generate(ids, SamplingParams(max_new_tokens=2))
        rows = results[tname] = {s: {run: Meter() for run in RUNS} for s in sets}
        for sname, prompts in sets.items():
            for i, ids in enumerate(prompts):
                order = RUNS[i % 3:] + RUNS[:i % 3]
                for run in order:
                    k = 0 if run == "plain" else None
                    rows[sname][run].add(engs[run].generate(ids, SamplingParams(max_new_tokens=args.new,
                                                                                num_draft_tokens=k)))
        console.print(cost_table(engs["measured"].costs.to_dict(),
                                 f"{tname}: measured cost table ({calibration:.1f} s to measure)"))
        del engs
    after = os.getloadavg()
    table = Table(title=f"SmolLM2-135M-Instruct ngram (K <= 4, 4 candidates), batch 1, greedy, <= {args.new} new "
                        f"tokens, {args.prompts} prompts per set")
    for col in ("target", "set", "policy", "tok/s", "x plain", "tok/step", "acc", "drafted/step", "same"):
        table.add_column(col, justify="left" if col in ("target", "set", "policy") else "right")
    for tname, sets_ in results.items():
        for sname, m in sets_.items():
            plain = m["plain"]
            for run, x in m.items():
                same = sum(a == b for a, b in zip(x.outputs, plain.outputs))
                table.add_row(tname, sname, run, f"{x.rate:.1f}", f"{x.rate / plain.rate:.2f}x",
                              f"{x.step_tokens / max(x.steps, 1):.2f}",
                              f"{x.accepted / x.drafted:.2f}" if x.drafted else "-",
                              f"{x.drafted / max(x.steps, 1):.2f}", f"{same}/{len(x.outputs)}")
    console.print(table)
    console.print(f"load average before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, after "
                  f"{after[0]:.2f} {after[1]:.2f} {after[2]:.2f}")


if __name__ == "__main__":
    main()
