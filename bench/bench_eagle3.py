"""SmolLM2-135M-Instruct with its EAGLE-3 head, batch 1, greedy, in one run.

    .venv/bin/python bench/bench_eagle3.py [--prompts 8] [--new 128] [--threads 2] [--no-served]
                                           [--heads NAME=DIR ...]   # more heads side by side (EAGLE-1, Medusa)

Needs `make smollm2`. Prompts: examples/smollm2/{chat,code}.jsonl (never in the training data: tests/train
check it), each a user turn in the chat template. Per prompt set it runs, in-process through the torch
runtime (fixed K, adaptive off): plain decoding, the EAGLE-3 chain (K = 4) and tree (8 nodes), and through
the bundled Triton server (gRPC streaming) plain and the chain. It prints

  tau        tokens per verify step (runtime.stats' definition)
  alpha      the chain's acceptance rate (accepted / drafted)
  c          draft cost per drafted token / the time of one plain decoding step
  ideal      E[tau] / (1 + K c) with E[tau] = (1 - alpha^(K+1)) / (1 - alpha): what the measured alpha and c allow
  speedup    tok/s over plain tok/s, and its share of the ideal

then, per drafter, what its training cost (its trtspec.train.json: kind, data, steps, minutes), so that heads
trained with the same budget (`trtspec train eagle|medusa --work <the EAGLE-3 run's work dir>`) are compared
side by side, and the load average before and after. A script that prints tables, never a test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from bench._common import Meter, jsonl_prompts as prompts, served_deployment  # noqa: E402
from trtspec import methods  # noqa: E402
from trtspec.artifacts.tokenizer import chat_prompt_ids  # noqa: E402
from trtspec.check import load_spec, spec_from_dict  # noqa: E402
from trtspec.runtime import SamplingParams  # noqa: E402
from trtspec.runtime.stats import acceptance_rate, tokens_per_step  # noqa: E402

MODEL = REPO / "examples" / "models" / "smollm2-135m-instruct"
HEAD = REPO / "examples" / "models" / "smollm2-135m-instruct-eagle3"
SPECS = {"eagle3 chain": REPO / "examples" / "smollm2" / "eagle3.toml",
         "eagle3 tree": REPO / "examples" / "smollm2" / "eagle3-tree.toml"}
SETS = {"chat": REPO / "examples" / "smollm2" / "chat.jsonl", "code": REPO / "examples" / "smollm2" / "code.jsonl"}


def fixed(spec):
    data = spec.to_dict()
    data["speculative"]["adaptive"]["enabled"] = False
    return spec_from_dict(data, source=spec.source)


def engines(extra: list[str]) -> dict[str, object]:
    out = {name: fixed(load_spec(path)) for name, path in SPECS.items()}
    for item in extra:  # NAME=DIR: another head (method by its files: medusa_lm_head.safetensors or EAGLE)
        name, _, d = item.partition("=")
        data = out["eagle3 chain"].to_dict()
        method = "medusa" if (Path(d) / "medusa_lm_head.safetensors").is_file() else "eagle"
        data["speculative"].update(method=method, heads=str(Path(d).resolve()))
        out[name] = spec_from_dict(data, source=SPECS["eagle3 chain"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8, help="prompts per set")
    ap.add_argument("--new", type=int, default=128, help="most new tokens per request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-served", action="store_true", help="skip the Triton server runs")
    ap.add_argument("--heads", action="append", default=[], metavar="NAME=DIR", help="another head to compare")
    args = ap.parse_args()
    if not (MODEL / "trtspec.import.json").is_file():
        sys.exit("error: SmolLM2 is not imported\nhint: run `make smollm2`")
    if not (HEAD / "config.json").is_file():
        sys.exit(f"error: no EAGLE-3 head in {HEAD}\nhint: trtspec train eagle3 -c examples/smollm2/eagle3.toml")
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows: dict[str, dict[str, Meter]] = {name: {} for name in SETS}
    ks: dict[str, int] = {}
    for i, (run, spec) in enumerate(engines(args.heads).items()):
        engine = methods.engine(spec)
        ks[run] = engine.k_max
        sets = {name: [chat_prompt_ids(engine.tokenizer, p) for p in prompts(path, args.prompts)]
                for name, path in SETS.items()}
        warm = sets["chat"][0]
        engine.generate(warm, SamplingParams(max_new_tokens=8, num_draft_tokens=0))
        engine.generate(warm, SamplingParams(max_new_tokens=8))
        for name, id_lists in sets.items():
            if i == 0:
                rows[name]["plain"] = Meter()
            rows[name][run] = Meter()
            for ids in id_lists:
                if i == 0:
                    rows[name]["plain"].add(engine.generate(ids, SamplingParams(max_new_tokens=args.new,
                                                                                num_draft_tokens=0)))
                rows[name][run].add(engine.generate(ids, SamplingParams(max_new_tokens=args.new)))
        engine.close()
    if not args.no_served:
        served(rows, args, load_spec(SPECS["eagle3 chain"]))
    show(rows, ks, args, load_before, os.getloadavg())
    costs({"eagle3": HEAD, **{item.partition("=")[0]: Path(item.partition("=")[2]) for item in args.heads}})


def costs(heads: dict[str, Path]) -> None:
    """The training record of each drafter (trtspec.train.json), one row each."""
    from rich.console import Console
    from rich.table import Table

    from trtspec.artifacts import manifest

    table = Table(title="training cost (trtspec.train.json)")
    for col in ("drafter", "kind", "samples", "tokens", "steps", "epochs", "train min", "trained params",
                "final loss (ema)"):
        table.add_column(col, justify="left" if col in ("drafter", "kind") else "right")
    for name, d in heads.items():
        m = manifest.read(d / manifest.FILE_NAMES[manifest.TRAIN], manifest.TRAIN)
        if m is None:
            table.add_row(name, "(no manifest)", *["-"] * 7)
            continue
        b, data = m["budget"], m["inputs"]["data"]
        table.add_row(name, m.get("method", "?"), str(data["samples"]), f"{data['tokens']:,}", str(b["steps_done"]),
                      str(b["epochs"]), f"{b['wall_s']['train'] / 60:.1f}", f"{m['params'] / 1e6:.2f}M",
                      str(m["losses"]["final_loss_ema"]))
    Console(width=160).print(table)


def served(rows, args, spec) -> None:
    from trtspec.client import generate_remote

    with served_deployment(spec, "bench-eagle3-") as server:
        for name, path in SETS.items():
            chats = [[{"role": "user", "content": p}] for p in prompts(path, args.prompts)]
            generate_remote(server.grpc_url, "", messages=chats[0], max_tokens=8, timeout=120)  # warm-up
            for key, k in (("served plain", 0), ("served eagle3 chain", 4)):
                m = rows[name][key] = Meter()
                for chat in chats:
                    t = time.perf_counter()
                    r = generate_remote(server.grpc_url, "", messages=chat, max_tokens=args.new,
                                        num_draft_tokens=k, timeout=300, stream=True)
                    m.tokens += r.new_tokens
                    m.seconds += time.perf_counter() - t


def show(rows, ks, args, before, after) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"SmolLM2-135M-Instruct + EAGLE-3, batch 1, greedy, <= {args.new} new tokens, "
                        f"{args.threads} threads, {args.prompts} prompts per set")
    for col in ("prompts", "run", "K", "tok/s", "x plain", "tau", "alpha", "c", "ideal", "share of ideal", "= plain"):
        table.add_column(col, justify="left" if col in ("prompts", "run") else "right")
    for name, m in rows.items():
        plain = m["plain"]
        step_s = plain.seconds / max(1, plain.tokens)
        served_plain = m.get("served plain")
        for key, meter in m.items():
            base = served_plain if key.startswith("served") else plain
            x = meter.rate / base.rate if base and base.rate else 0.0
            k = ks.get(key.removeprefix("served "), 0)
            cells = [name, key, str(k or "-"), f"{meter.rate:.1f}", f"{x:.2f}x"]
            if meter.drafted:
                tau, alpha = (tokens_per_step(meter.step_tokens, meter.steps),
                              acceptance_rate(meter.accepted, meter.drafted))
                c = (meter.draft_seconds / meter.drafted) / step_s
                chain = "tree" not in key
                e_tau = (1 - alpha ** (k + 1)) / (1 - alpha) if chain and alpha < 1 else tau
                ideal = e_tau / (1 + (k if chain else meter.drafted / max(1, meter.steps)) * c)
                cells += [f"{tau:.2f}", f"{alpha:.2f}", f"{c:.3f}", f"{ideal:.2f}x", f"{x / ideal:.2f}"]
            else:
                cells += ["-"] * 5
            same = "-"
            if meter.outputs and key != "plain" and not key.startswith("served"):
                same = f"{sum(a == b for a, b in zip(meter.outputs, plain.outputs))}/{len(meter.outputs)}"
            table.add_row(*cells, same)
    console = Console(width=160)
    console.print(table)
    console.print(f"load average before {before[0]:.2f} {before[1]:.2f} {before[2]:.2f}, "
                  f"after {after[0]:.2f} {after[1]:.2f} {after[2]:.2f} ({os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
