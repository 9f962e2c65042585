"""SmolLM2-135M-Instruct at batch 1: trtspec against transformers on the same machine, in one run.

    .venv/bin/python bench/bench_smollm2.py [--prompts 4] [--new 128] [--threads 2] [--no-served]

Needs `make smollm2` (the import in examples/models/smollm2-135m-instruct/). For the chat and the code prompt
sets (examples/smollm2/{chat,code}.jsonl, each prompt a user message rendered with the chat template, greedy,
up to --new tokens or the chat's EOS) it runs, prompt by prompt:

  transformers plain    LlamaForCausalLM.generate(do_sample=False) on the same checkpoint (fp32, KV cache)
  trtspec plain         the torch runtime in-process, num_draft_tokens = 0
  trtspec ngram         the same engine with n-gram prompt lookup (examples/smollm2/ngram.toml)
  trtspec ... int8      the same with a weight-only int8 target (examples/smollm2/ngram-int8.toml: another
                        model than fp32's, so its outputs are compared with its own plain decoding)
  served plain / spec   the same deployment through the bundled Triton server, gRPC streaming, chat sent as
                        the `messages` input (rendered by the server)

and prints tokens/s (generated tokens / wall time) with the ratios to transformers, and the load average
before and after. A script that prints a table, never a test: timings depend on the machine and its load.
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

from bench._common import Meter, jsonl_prompts as prompts, run_transformers, served_deployment  # noqa: E402
from trtspec import methods  # noqa: E402
from trtspec.artifacts.tokenizer import chat_prompt_ids  # noqa: E402
from trtspec.check import load_spec  # noqa: E402
from trtspec.runtime import SamplingParams  # noqa: E402

MODEL = REPO / "examples" / "models" / "smollm2-135m-instruct"
SPEC = REPO / "examples" / "smollm2" / "ngram.toml"
SPECS = {"": SPEC, " int8": REPO / "examples" / "smollm2" / "ngram-int8.toml"}  # row suffix -> spec
SETS = {"chat": REPO / "examples" / "smollm2" / "chat.jsonl", "code": REPO / "examples" / "smollm2" / "code.jsonl"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4, help="prompts per set")
    ap.add_argument("--new", type=int, default=128, help="most new tokens per request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-served", action="store_true", help="skip the Triton server runs")
    args = ap.parse_args()
    if not (MODEL / "trtspec.import.json").is_file():
        sys.exit("error: SmolLM2 is not imported\nhint: run `make smollm2`")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()

    from transformers import AutoModelForCausalLM

    engines = {suffix: methods.engine(load_spec(path)) for suffix, path in SPECS.items()}
    engine = engines[""]
    eos = sorted(engine.eos_ids)
    hf = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).eval()
    sets = {name: [chat_prompt_ids(engine.tokenizer, p) for p in prompts(path, args.prompts)]
            for name, path in SETS.items()}
    rows: dict[str, dict[str, Meter]] = {name: {} for name in sets}
    warm = sets["chat"][0]
    for e in engines.values():
        e.generate(warm, SamplingParams(max_new_tokens=8, num_draft_tokens=0))
        e.generate(warm, SamplingParams(max_new_tokens=8))
    run_transformers(hf, warm, 8, eos)
    runs = [(f"trtspec {run}{suffix}", e, k) for suffix, e in engines.items()
            for run, k in (("plain", 0), ("ngram", None))]
    for name, id_lists in sets.items():
        m = rows[name]
        m["transformers plain"] = Meter()
        for key, _, _ in runs:
            m[key] = Meter()
        for ids in id_lists:  # prompt by prompt, every run side by side
            m["transformers plain"].add_tokens(*run_transformers(hf, ids, args.new, eos))
            for key, e, k in runs:
                m[key].add(e.generate(ids, SamplingParams(max_new_tokens=args.new, num_draft_tokens=k)))
    for e in engines.values():
        e.close()
    del hf
    if not args.no_served:
        for suffix, path in SPECS.items():
            served(rows, args, load_spec(path), suffix)
    show(rows, args, load_before, os.getloadavg())


def served(rows, args, spec, suffix: str = "") -> None:
    from trtspec.client import generate_remote

    with served_deployment(spec, "bench-smollm2-") as server:
        for name, path in SETS.items():
            chats = [[{"role": "user", "content": p}] for p in prompts(path, args.prompts)]
            generate_remote(server.grpc_url, "", messages=chats[0], max_tokens=8, timeout=120)  # warm-up
            for key, k in ((f"served plain{suffix}", 0), (f"served ngram{suffix}", None)):
                m = rows[name][key] = Meter()
                for chat in chats:
                    r = generate_remote(server.grpc_url, "", messages=chat, max_tokens=args.new,
                                        num_draft_tokens=k, timeout=300)
                    m.tokens += r.new_tokens
                    m.seconds += r.seconds


def show(rows, args, before, after) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"SmolLM2-135M-Instruct, batch 1, greedy, <= {args.new} new tokens, {args.threads} threads, "
                        f"{args.prompts} prompts per set")
    for col in ("prompts", "run", "tokens", "tok/s", "x transformers", "x trtspec plain", "same as its plain"):
        table.add_column(col, justify="right" if col not in ("prompts", "run") else "left")
    for name, m in rows.items():
        hf, plain = m["transformers plain"].rate, m["trtspec plain"].rate
        for key, meter in m.items():
            same, ref = "-", "trtspec plain int8" if key.endswith(" int8") else "trtspec plain"
            if meter.outputs and key != ref:
                same = f"{sum(a == b for a, b in zip(meter.outputs, m[ref].outputs))}/{len(meter.outputs)}"
            table.add_row(name, key, str(meter.tokens), f"{meter.rate:.1f}", f"{meter.rate / hf:.2f}x",
                          f"{meter.rate / plain:.2f}x", same)
    console = Console(width=140)
    console.print(table)
    for name, m in rows.items():  # the int8 target is another model: how far its greedy text follows fp32's
        a, b = m["trtspec plain int8"].outputs, m["trtspec plain"].outputs
        agree = [next((i for i, (x, y) in enumerate(zip(u, v)) if x != y), min(len(u), len(v))) for u, v in zip(a, b)]
        console.print(f"{name}: int8 target vs fp32, greedy tokens equal before the first difference: "
                      f"{agree} of {[len(v) for v in b]}")
    console.print(f"load average before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, "
                  f"after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f} ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
