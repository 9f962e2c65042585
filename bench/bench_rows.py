"""A target pass's cost by row count, and whether every row of it is bit-identical to its own one-row step.

    .venv/bin/python bench/bench_rows.py [--reps 7] [--threads 2] [--context 200] [--rows 1,2,4,5,8,9,16]
                                         [--models smollm2,qwen] [--dtypes float32,bfloat16,int8,w8a8,w4a8] [--old]

For SmolLM2-135M (`make smollm2`: examples/models/smollm2-135m-instruct) and, where its import exists,
Qwen2.5-Coder-1.5B-Instruct (examples/models/qwen2.5-coder-1.5b-instruct, or --qwen DIR), in float32, bfloat16
matmul weights (where the CPU multiplies bf16 natively), weight-only int8, W8A8 (int8 activations too) and W4A8
(4-bit weights in groups, int8 activations): after
a prefill of --context tokens, a pass of R rows (a verify chain of R tokens) is timed for each R, round robin over
the row counts, best of --reps.
Printed per row count: ms per pass, x the one-row step, weight GB/s (the matmul weights' bytes / time), and
`exact`: every row's logits equal, bit for bit, those of R one-row decode steps of the same tokens.

--old adds the runtime as it was before row blocks (runtime/linear.py), side by side in the same process: each
oneDNN matmul called once with the pass's own rows, and bf16 layers on the torch path (not fused). A script that
prints a table, never a test: timings depend on the machine and its load (printed with the CPU's flags).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import cpu_model, vector_flags  # noqa: E402
from trtspec.runtime.cache import chain_inputs  # noqa: E402
from trtspec.runtime.linear import Linear  # noqa: E402
from trtspec.runtime.llama import Llama  # noqa: E402

MODELS = {"smollm2": ROOT / "examples/models/smollm2-135m-instruct",
          "qwen": ROOT / "examples/models/qwen2.5-coder-1.5b-instruct"}


def load(path: Path, dtype: str, context: int, max_rows: int) -> Llama:
    weight = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    return Llama.from_dir(path, dtype="float32", max_seq=context + 2 * max_rows + 8, weight_dtype=weight,
                          quantization=dtype if dtype in ("int8", "w8a8", "w4a8") else None)


def linears(m: Llama) -> list:
    return [m.head] + [x for lw in m.layers for x in (lw.qkv, lw.o, lw.gate_up, lw.down)]


def as_old(m: Llama) -> None:
    """The runtime before row blocks: one oneDNN call with the pass's own rows, bf16 layers not fused."""
    for lin in linears(m):
        if isinstance(lin, Linear) and lin.rows is not None:
            lin.rows = (1, 1 << 30)
    if any(isinstance(x, Linear) and x.w.dtype == torch.bfloat16 for x in linears(m)):
        for lw in m.layers:
            lw.fused = None
    else:
        m.prepare_fused()  # (the kernel reads each linear's rows at this point)


def state(m: Llama) -> tuple:
    """What as_old changes: each linear's row blocks, each layer's fused kernel."""
    return [(lin, getattr(lin, "rows", None)) for lin in linears(m)], [lw.fused for lw in m.layers]


def restore(m: Llama, st: tuple) -> None:
    lins, fused = st
    for lin, rows in lins:
        if rows is not None:
            lin.rows = rows
    for lw, f in zip(m.layers, fused):
        lw.fused = f


def weight_bytes(m: Llama) -> int:
    """The bytes of the matmul weights a pass streams (an int8 linear's `w` is its int8 `q`)."""
    return sum(lin.w.numel() * lin.w.element_size() for lin in linears(m))


class Bench:
    """One variant of a model (its `state`: one model in memory serves both) with its own cache, prefilled with
    `context` tokens."""

    def __init__(self, m: Llama, st: tuple, context: int, ids: list[int]):
        self.m, self.state, self.context, self.ids = m, st, context, ids
        self.cache = m.new_cache(1)
        inp = chain_inputs([0], context)
        restore(m, st)
        with torch.inference_mode():
            m.forward(self.cache, inp.positions, inp.start, inp.mask, tokens=torch.tensor([ids[:context]]))

    @property
    def fused(self) -> bool:
        return all(f is not None for f in self.state[1])

    @torch.inference_mode()
    def run(self, rows: int, at: int | None = None) -> torch.Tensor:
        restore(self.m, self.state)
        at = self.context if at is None else at
        inp = chain_inputs([at], rows)
        lg, _ = self.m.forward(self.cache, inp.positions, inp.start, inp.mask,
                               tokens=torch.tensor([self.ids[at:at + rows]]))
        return lg[0]  # [rows, vocab]

    def exact(self, rows: int) -> bool:
        many = self.run(rows)
        one = torch.cat([self.run(1, self.context + i) for i in range(rows)])
        return torch.equal(many, one)


def measure(benches: dict[str, Bench], rows: list[int], reps: int) -> dict[tuple[str, int], float]:
    best: dict[tuple[str, int], float] = {}
    for _ in range(reps):
        for r in rows:
            for name, b in benches.items():  # round robin: each variant and row count sees the same load
                t = time.perf_counter()
                b.run(r)
                dt = time.perf_counter() - t
                best[name, r] = min(best.get((name, r), dt), dt)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--rows", default="1,2,4,5,8,9,16")
    ap.add_argument("--models", default="smollm2,qwen")
    ap.add_argument("--dtypes", default="float32,bfloat16,int8,w8a8,w4a8")
    ap.add_argument("--qwen", type=Path, default=None, help="the Qwen2.5-Coder-1.5B import (default: examples/)")
    ap.add_argument("--old", action="store_true", help="also the runtime before row blocks, side by side")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    paths = dict(MODELS, **({"qwen": args.qwen} if args.qwen else {}))
    print(f"# {cpu_model()}; flags: {' '.join(sorted(vector_flags()))}")
    print(f"# torch {torch.__version__}, {args.threads} threads, context {args.context}, best of {args.reps}, "
          f"load average before {os.getloadavg()}")
    print("| model | dtype | runtime | rows | ms | x one row | weights GB/s | rows exact |")
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models.split(","):
        path = paths[model]
        if not (path / "config.json").exists():
            print(f"# {model}: no import at {path}, skipped")
            continue
        for dtype in args.dtypes.split(","):
            ids = torch.randint(0, 1000, (args.context + 2 * max(rows),),
                                generator=torch.Generator().manual_seed(0)).tolist()
            m = load(path, dtype, args.context, max(rows))
            variants = {"new": state(m)}
            if args.old:
                as_old(m)
                variants["old"] = state(m)
            nbytes = weight_bytes(m)
            benches = {k: Bench(m, st, args.context, ids) for k, st in variants.items()}
            for b in benches.values():
                b.run(max(rows))  # warm up
            best = measure(benches, rows, args.reps)
            for name, b in benches.items():
                kind = "fused" if b.fused else "torch"
                for r in rows:
                    ms = best[name, r] * 1e3
                    exact = "yes" if b.exact(r) else "NO"
                    print(f"| {model} | {dtype} | {name} ({kind}) | {r} | {ms:.1f} | {ms / (best[name, 1] * 1e3):.2f} "
                          f"| {nbytes / best[name, r] / 1e9:.1f} | {exact} |", flush=True)
            del benches, variants, m
            gc.collect()
    print(f"# load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
