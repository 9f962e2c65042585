"""Local benchmark of the torch runtime on the demo family: batch 1, greedy, held-out prompts.

    .venv/bin/python bench/bench_local.py [--models examples/models] [--prompts 20] [--new 128] [--threads 1]

For plain decoding and each drafter (settings from examples/demo/<method>.toml, K fixed at the spec's
num_draft_tokens so the numbers are comparable to the formula), and for transformers' own assisted
generation (draft model) and prompt-lookup generation on the same pair and prompts, it prints:

  tok/s      new tokens / wall time over all prompts (one run, after a warm-up request)
  speedup    tok/s / plain tok/s of the same runtime
  α          per-token acceptance: accepted / (accepted + rejections), one rejection per step that stopped
             before the end of its draft (the i.i.d. estimate used by the formula)
  τ          tokens per verify step, measured;  E[τ] = (1 − α^(K+1)) / (1 − α), averaged over the steps at
             each step's drafted depth K (n-gram steps without a match draft nothing: 1 token)
  K·c        draft cost per step in units of one plain decode step (measured: draft seconds per step /
             plain seconds per token)
  ideal      E[τ] / (K·c + 1);  eff = speedup / ideal
  same       every output identical to plain greedy decoding (tokens)

This is a script that prints a table, never a test: timings depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trtspec import methods  # noqa: E402
from trtspec.check import spec_from_dict  # noqa: E402
from trtspec.runtime import SamplingParams, SpecEngine  # noqa: E402
from trtspec.runtime.stats import tokens_per_step  # noqa: E402

METHODS = ["draft-model", "eagle", "medusa", "lookahead"]


def load_prompts(models: Path, n: int, tokenizer) -> list[list[int]]:
    try:
        from trtspec.train.data import heldout_prompts

        texts = heldout_prompts(n, prompt_tokens=64, models_dir=models)
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    except Exception as exc:  # a non-demo family: random prompts
        print(f"(held-out prompts unavailable: {exc}; using random token prompts)")
        g = torch.Generator().manual_seed(0)
        V = tokenizer.vocab_size
        return [torch.randint(1, V, (64,), generator=g).tolist() for _ in range(n)]


def spec_for(method: str, models: Path, **over):
    data = tomllib.loads((REPO / "examples" / "demo"
                          / f"{method if method != 'none' else 'draft-model'}.toml").read_text())
    data["model"]["target"] = str(models / "target")
    sp = data["speculative"]
    if method == "none":
        sp.clear()
        sp["method"] = "none"
    elif method == "draft-model":
        sp["draft"] = str(models / "draft")
    elif method in ("medusa", "eagle"):
        sp["heads"] = str(models / method)
    sp.update(over)
    data["limits"]["max_batch_size"] = 1
    return spec_from_dict(data)


def run_engine(eng: SpecEngine, prompts, n_new: int, k: int | None):
    sp = SamplingParams(max_new_tokens=n_new, end_id=-1, num_draft_tokens=k)
    eng.generate(prompts[0][:16], SamplingParams(max_new_tokens=8, end_id=-1, num_draft_tokens=k))  # warm-up
    t0 = time.perf_counter()
    res = [eng.generate(p, sp) for p in prompts]
    return time.perf_counter() - t0, res


def expected_tau(alpha: float, k: float) -> float:
    return k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


class StepLog:
    """Per request-step (drafted depth, accepted) of an engine, from its per-step SpecDecodingStats."""

    def __init__(self, eng: SpecEngine):
        self.steps: list[tuple[int, int]] = []
        eng.on_step.append(lambda stats: self.steps.extend(zip(stats.depths, stats.accepted)))

    def alpha(self) -> tuple[float, float, float]:
        """(α̂, mean drafted depth, E[τ]): α̂ over the steps that drafted; E[τ] averages the formula over all
        steps at each step's own depth (a step that drafted nothing yields 1 token)."""
        drafted = [(d, a) for d, a in self.steps if d > 0]
        acc = sum(a for _, a in drafted)
        rejects = sum(1 for d, a in drafted if a < d)
        alpha = acc / max(1, acc + rejects)
        depth = sum(d for d, _ in drafted) / max(1, len(drafted))
        e_tau = sum(expected_tau(alpha, d) for d, _ in self.steps) / max(1, len(self.steps))
        return alpha, depth, e_tau


def hf_runs(models: Path, prompts, n_new: int, k: int):
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(models / "target", dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(models / "draft", dtype=torch.float32).eval()
    for m in (target, draft):
        m.generation_config.eos_token_id = None
        m.generation_config.pad_token_id = 0
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0
    rows = {}
    configs = {
        "transformers plain": {},
        f"transformers assisted (K={k})": {"assistant_model": draft},
        f"transformers prompt-lookup ({k})": {"prompt_lookup_num_tokens": k},
    }
    for name, kw in configs.items():
        def gen(p, n):
            ids = torch.tensor([p])
            with torch.inference_mode():
                out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                                      **kw)
            return out[0, len(p):].tolist()

        gen(prompts[0][:16], 8)
        t0 = time.perf_counter()
        outs = [gen(p, n_new) for p in prompts]
        rows[name] = (time.perf_counter() - t0, outs)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=Path, default=REPO / "examples" / "models")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' assisted/prompt-lookup runs")
    ap.add_argument("--adaptive", action="store_true", help="also run each method with adaptive K")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    models = args.models.resolve()
    manifest = models / "MANIFEST.json"
    if not (models / "target" / "config.json").is_file():
        print(f"no demo family at {models} (train it: trtspec models train-demo)")
        return 1
    print(f"models: {models}{'' if manifest.is_file() else ' (no MANIFEST.json)'}  threads: {args.threads}  "
          f"prompts: {args.prompts} x {args.new} new tokens, greedy, batch 1  load avg: {os.getloadavg()[0]:.2f}")

    plain_eng = methods.engine(spec_for("none", models))
    prompts = load_prompts(models, args.prompts, plain_eng.tokenizer)
    n_tokens = len(prompts) * args.new
    t_plain, plain = run_engine(plain_eng, prompts, args.new, 0)
    plain_tokens = [r.tokens for r in plain]
    per_token = t_plain / sum(r.steps + 1 for r in plain)
    rows = [dict(name="trtspec plain", tok_s=n_tokens / t_plain, speedup=1.0, same=True)]
    del plain_eng

    for method in [m for m in args.methods.split(",") if m]:
        spec = spec_for(method, models)
        eng = methods.engine(spec)
        log = StepLog(eng)
        K = eng.k_max
        for adaptive in ([False, True] if args.adaptive else [False]):
            log.steps.clear()
            t, res = run_engine(eng, prompts, args.new, None if adaptive else K)
            steps = sum(r.steps for r in res)
            tau = tokens_per_step(sum(len(r.tokens) - 1 for r in res), steps)  # prefill tokens excluded
            a, depth, e_tau = log.alpha()
            kc = (sum(r.draft_seconds for r in res) / steps) / per_token
            ideal = e_tau / (kc + 1)
            speed = (n_tokens / t) / rows[0]["tok_s"]
            rows.append(dict(name=f"trtspec {method} (K={K}{', adaptive' if adaptive else ''})", tok_s=n_tokens / t,
                             speedup=speed, alpha=a,
                             acc=sum(r.accepted for r in res) / max(1, sum(r.drafted for r in res)),
                             tau=tau, e_tau=e_tau, kc=kc, ideal=ideal, eff=speed / ideal,
                             same=[r.tokens for r in res] == plain_tokens,
                             verify_ms=1e3 * sum(r.verify_seconds for r in res) / steps,
                             draft_ms=1e3 * sum(r.draft_seconds for r in res) / steps))
        del eng

    if not args.no_hf and (models / "draft" / "config.json").is_file():
        k = spec_for("draft-model", models).speculative.num_draft_tokens
        for name, (t, outs) in hf_runs(models, prompts, args.new, k).items():
            rows.append(dict(name=name, tok_s=n_tokens / t, speedup=(n_tokens / t) / rows[0]["tok_s"],
                             same=outs == plain_tokens))

    print_table(rows, per_token)
    print(f"(load average at the end: {os.getloadavg()[0]:.2f}; other processes on the machine skew timings)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


def print_table(rows, per_token: float) -> None:
    def f(v, fmt):
        return "" if v is None else format(v, fmt)

    head = f"{'run':42s} {'tok/s':>7s} {'speedup':>7s} {'α':>5s} {'acc':>5s} {'τ':>5s} {'E[τ]':>5s} {'K·c':>5s} " \
           f"{'ideal':>5s} {'eff':>5s} {'draft ms':>8s} {'verify ms':>9s} same"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['name']:42s} {r['tok_s']:7.1f} {r['speedup']:7.2f} {f(r.get('alpha'), '5.2f'):>5s} "
              f"{f(r.get('acc'), '5.2f'):>5s} {f(r.get('tau'), '5.2f'):>5s} {f(r.get('e_tau'), '5.2f'):>5s} "
              f"{f(r.get('kc'), '5.2f'):>5s} {f(r.get('ideal'), '5.2f'):>5s} {f(r.get('eff'), '5.2f'):>5s} "
              f"{f(r.get('draft_ms'), '8.2f'):>8s} {f(r.get('verify_ms'), '9.2f'):>9s} {'yes' if r['same'] else 'NO'}")
    print(f"(plain decode step: {1e3 * per_token:.2f} ms/token; speedups of transformers rows are vs trtspec plain)")


if __name__ == "__main__":
    sys.exit(main())
