"""The operate figures (bench grid, tune, deploy, routing), in one run per part (each well under 10 minutes on 2 cores):

    python bench/bench_operate.py grid     # demo draft-model served: concurrency x K, then tune, then the
                                           # tuned deployment served beside the original (same server)
    python bench/bench_operate.py quant    # in-process: float vs int8 vs int4 drafter (draft-model, eagle)
    python bench/bench_operate.py smollm2  # SmolLM2-135M lookahead served: concurrency x K

Every output is greedy and compared with K = 0 (mismatches must be 0). Prints the tables and the load average
before and after; JSON goes to --out (default /tmp/bench_operate).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _serve(specs, root: Path):
    """Build the specs and serve them all from one bundled Triton (ensemble_<i>); returns (server, names)."""
    from trtspec.backends import build
    from trtspec.builders import BuildOptions
    from trtspec.repository.torch_repo import ModelNames, emit_torch_repository
    from trtspec.serve import TritonServer

    shared, names = root / "shared", []
    for i, spec in enumerate(specs):
        result = build(spec, BuildOptions(out_engines=root / f"engines{i}", out_repo=root / f"repo{i}", progress=False))
        n = ModelNames(generation=f"tensorrt_llm_{i}", ensemble=f"ensemble_{i}")
        emit_torch_repository(spec, shared, Path(result.engines["target"]).parent, names=n)
        names.append(n.ensemble)
    server = TritonServer(shared, ready_timeout=300)
    server.start()
    return server, names


def _with(spec, **speculative):
    from trtspec.check import spec_from_dict

    data = spec.to_dict()
    data["speculative"].update(speculative)
    return spec_from_dict(data, source=spec.source)


def grid(args) -> dict:
    from trtspec.bench import load
    from trtspec.bench.prompts import builtin
    from trtspec.bench.tune import best_schedule
    from trtspec.cli.bench import grid_table
    from trtspec.check import load_spec

    spec = load_spec(ROOT / "examples/demo/draft-model.toml")
    prompts = builtin("code")[:args.n]
    root = Path(tempfile.mkdtemp(prefix="bench-operate-"))
    server, (ens,) = _serve([spec], root)
    try:
        g = load.measure(spec, prompts, [1, 4, 16], [0, 2, 4, None], max_tokens=args.max_tokens,
                         url=server.grpc_url, model=ens, metrics_url=server.metrics_url)
    finally:
        server.stop()
    grid_table(g)
    schedule = best_schedule(g, spec)
    tuned = _with(spec, schedule={str(b): k for b, k in schedule.items()})
    print("tuned schedule:", schedule)
    server, (ens0, ens1) = _serve([spec, _with(tuned, **{})], root / "tuned")
    try:
        cmp = {}
        for label, ens_name, s in (("original", ens0, spec), ("tuned", ens1, tuned)):
            cmp[label] = load.measure(s, prompts, [1, 16], [0, None], max_tokens=args.max_tokens,
                                      url=server.grpc_url, model=ens_name)
            grid_table(cmp[label])
    finally:
        server.stop()
    return {"grid": g.to_dict(), "schedule": schedule, **{k: v.to_dict() for k, v in cmp.items()}}


def quant(args) -> dict:
    from trtspec.bench import load
    from trtspec.bench.prompts import builtin
    from trtspec.cli.bench import grid_table
    from trtspec.check import load_spec

    prompts = builtin("code")[:args.n]
    out = {}
    for demo in ("draft-model", "eagle"):
        spec = load_spec(ROOT / f"examples/demo/{demo}.toml")
        for mode in (None, "int8", "int4"):
            s = _with(spec, draft_quantization=mode)
            g = load.measure(s, prompts, [1], [0, 4], max_tokens=args.max_tokens)
            g.name = f"{spec.name} drafter {mode or 'float32'}"
            grid_table(g)
            out[f"{demo}/{mode or 'float32'}"] = g.to_dict()
    return out


def smollm2(args) -> dict:
    from trtspec.bench import load
    from trtspec.bench.prompts import builtin
    from trtspec.cli.bench import grid_table
    from trtspec.check import load_spec

    spec = load_spec(ROOT / "examples/smollm2/lookahead.toml")
    prompts = builtin("edit")[:args.n]
    root = Path(tempfile.mkdtemp(prefix="bench-operate-smol-"))
    server, (ens,) = _serve([spec], root)
    try:
        g = load.measure(spec, prompts, [1, 4], [0, 4], max_tokens=args.max_tokens, url=server.grpc_url,
                         model=ens, metrics_url=server.metrics_url)
    finally:
        server.stop()
    grid_table(g)
    return g.to_dict()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["grid", "quant", "smollm2"])
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default="/tmp/bench_operate")
    args = ap.parse_args()
    print("load average before:", os.getloadavg())
    result = {"grid": grid, "quant": quant, "smollm2": smollm2}[args.part](args)
    print("load average after:", os.getloadavg())
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"{args.part}.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
