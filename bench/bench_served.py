"""Served benchmark: tokens/s through the bundled Triton server, with and without speculation.

    .venv/bin/python bench/bench_served.py [--models examples/models] [--methods draft-model,eagle,...]
                                           [--prompts 8] [--new 128]

Builds each demo deployment (examples/demo/<method>.toml, checkpoints from --models) into bench/out/, serves
all of them from ONE Triton server (shared preprocessing/postprocessing, one `tensorrt_llm_<method>` and
`ensemble_<method>` each), and sends the same greedy prompts one at a time (batch 1) over gRPC streaming:
first with `num_draft_tokens = 0` (plain decoding in the same engine), then with the spec's default
(speculation, adaptive K). It prints per method:

  plain tok/s   generated tokens / client wall time, num_draft_tokens = 0
  spec tok/s    the same with speculation
  ratio         spec / plain
  accept        accepted / drafted draft tokens (server-reported, all prompts)
  tok/step      tokens per verify step (server-reported)
  TTFT ms       mean time to first text, speculation on
  same          every speculative text identical to the plain one
  v(K+1)/v(1)   the engine's measured cost of a pass over K + 1 rows, in one-row decode steps (runtime/costs.py)
  c             its measured draft step, in one-row decode steps: what adaptive K prices its options with

A script that prints a table, never a test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tomllib
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trtspec.backends import build  # noqa: E402
from trtspec.builders import BuildOptions  # noqa: E402
from trtspec.check import spec_from_dict  # noqa: E402
from trtspec.client import generate_remote  # noqa: E402
from trtspec.repository.torch_repo import ModelNames, emit_torch_repository  # noqa: E402
from trtspec.runtime.stats import tokens_per_step  # noqa: E402
from trtspec.serve import TritonServer  # noqa: E402
from trtspec.serve.control import scrape, spec_metrics  # noqa: E402

METHODS = ["draft-model", "eagle", "medusa", "lookahead"]
FALLBACK_PROMPTS = ["def parse_args(argv):\n    ", "import os\nimport sys\n\n\ndef main():\n", "class Cache:\n    ",
                    "for i in range(", "    def __repr__(self):\n        return ", "try:\n    import json\nexcept"]


def spec_for(method: str, models: Path):
    """examples/demo/<method>.toml with its checkpoints taken from `models`."""
    path = REPO / "examples" / "demo" / f"{method}.toml"
    data = tomllib.loads(path.read_text())
    data["model"]["target"] = str(models / "target")
    sp = data["speculative"]
    if method == "draft-model":
        sp["draft"] = str(models / "draft")
    elif method in ("medusa", "eagle"):
        sp["heads"] = str(models / method)
    return spec_from_dict(data, source=path)


def prompts_for(models: Path, n: int) -> list[str]:
    try:
        from trtspec.train.data import heldout_prompts

        return list(heldout_prompts(n, prompt_tokens=64, models_dir=models))
    except Exception as exc:  # not the demo family: fixed code prompts
        print(f"(held-out prompts unavailable: {exc}; using fixed prompts)")
        return (FALLBACK_PROMPTS * (n // len(FALLBACK_PROMPTS) + 1))[:n]


def run(url: str, model: str, prompts: list[str], new: int, k: int | None) -> dict:
    generate_remote(url, prompts[0], max_tokens=8, model=model, num_draft_tokens=k)  # warm-up
    results = [generate_remote(url, p, max_tokens=new, model=model, num_draft_tokens=k, timeout=600)
               for p in prompts]
    seconds = sum(r.seconds for r in results)
    tokens = sum(r.new_tokens for r in results)
    drafted = sum(r.total_draft_tokens for r in results)
    steps = sum(r.steps for r in results)
    return {"tok_s": tokens / seconds, "tokens": tokens, "seconds": seconds, "texts": [r.text for r in results],
            "acceptance": sum(r.total_accepted_draft_tokens for r in results) / drafted if drafted else 0.0,
            "tokens_per_step": tokens_per_step(tokens - len(results), steps),
            "ttft_ms": 1000 * sum(r.ttft_seconds or 0.0 for r in results) / len(results)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, default=REPO / "examples" / "models")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "served")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    models = args.models.resolve()
    if not (models / "target" / "config.json").is_file():
        print(f"no demo family at {models} (train it: trtspec models train-demo)")
        return 1
    methods = [m for m in args.methods.split(",") if m]
    options = BuildOptions(out_engines=args.out / "engines", out_repo=args.out / "model_repository", progress=False)
    shared = args.out / "shared_repository"
    specs = {}
    for method in methods:
        spec = spec_for(method, models)
        result = build(spec, options)
        names = ModelNames(generation=f"tensorrt_llm_{method.replace('-', '_')}",
                           ensemble=f"ensemble_{method.replace('-', '_')}")
        emit_torch_repository(spec, shared, Path(result.engines["target"]).parent, names=names)
        specs[method] = (spec, names.ensemble)
    prompts = prompts_for(models, args.prompts)
    print(f"models: {models}  prompts: {len(prompts)} x {args.new} new tokens, greedy, batch 1, served over gRPC")
    rows = []
    with TritonServer(shared, ready_timeout=600) as server:
        for method, (spec, ensemble) in specs.items():
            plain = run(server.grpc_url, ensemble, prompts, args.new, 0)
            spec_run = run(server.grpc_url, ensemble, prompts, args.new, None)
            rows.append({"method": method, "K": spec.speculative.num_draft_tokens, "plain_tok_s": plain["tok_s"],
                         "spec_tok_s": spec_run["tok_s"], "ratio": spec_run["tok_s"] / plain["tok_s"],
                         "acceptance": spec_run["acceptance"], "tokens_per_step": spec_run["tokens_per_step"],
                         "ttft_ms": spec_run["ttft_ms"], "same": spec_run["texts"] == plain["texts"]})
        served = spec_metrics(scrape(server.metrics_url))
    for r in rows:  # the cost table each engine measured at load, which adaptive K prices its options with
        spec = specs[r["method"]][0]
        costs = (served.get(spec.name) or {}).get("costs") or {"verify": {}, "draft": {}}
        verify, one = costs["verify"], costs["verify"].get(1)
        r["verify_k1"] = verify.get(r["K"] + 1, float("nan")) / one if one else float("nan")
        r["c"] = max(costs["draft"].values(), default=float("nan")) / one if one else float("nan")
    header = f"{'method':<12} {'K':>2} {'plain tok/s':>11} {'spec tok/s':>10} {'ratio':>6} {'accept':>6} " \
             f"{'tok/step':>8} {'TTFT ms':>7} {'same':>5} {'v(K+1)/v(1)':>11} {'c':>5}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['method']:<12} {r['K']:>2} {r['plain_tok_s']:>11.1f} {r['spec_tok_s']:>10.1f} {r['ratio']:>5.2f}x "
              f"{r['acceptance']:>6.2f} {r['tokens_per_step']:>8.2f} {r['ttft_ms']:>7.1f} {str(r['same']):>5} "
              f"{r['verify_k1']:>11.2f} {r['c']:>5.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
