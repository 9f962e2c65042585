"""The GPU check of the torch runtime (ci/gpu-check.sh runs it): for a CUDA machine with PyTorch and transformers
but no TensorRT-LLM, no Triton and no network, in a few minutes.

    python bench/gpu_check.py [--device cuda] [--quick] [--batches 1,4,16] [--methods ...] [--json out.json]

1. identity     the tests' tiny random family (tests/runtime/family.py) on the device, float32: every method
                (draft-model, near-copy draft, Medusa and EAGLE chains and trees, lookahead) greedy at batch 1
                and 4 (8 prompts through 4 rows), with adaptive and with a fixed K, equals plain decoding and
                transformers' greedy on the same device (what tests/runtime/test_engine.py checks on CPU);
2. lossless     sampled draft-model decoding on a vocab-8 pair: the first two speculative tokens of seeded
                requests follow the target's processed joint distribution (chi-square z < 4), and the same
                check with the residual broken fails it (z > 8) so the check can fail;
3. speed        the demo family (examples/models) for every method at batch 1, 4 and 16: tok/s, x plain at the
                same batch, tokens per verify step, acceptance, and whether the output equals plain decoding's.

Timings sync the device (torch.cuda.synchronize) before the clock starts and stops. Exit status: 0 every check
passed, 1 a check failed (the table still prints), 2 the device is not there. `--device cpu --quick` runs the
same code on CPU with tiny counts (what the CPU tests run). A timing table, never a test of speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
import tomllib
import traceback
from pathlib import Path
from typing import Any, Callable

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

METHODS = ("draft-model", "eagle", "medusa", "lookahead")
BATCHES = (1, 4, 16)
DTYPES = ("float32", "float16", "bfloat16")


# ------------------------------------------------------------------------------------------ arguments


def _ints(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated whole numbers, e.g. 1,4,16") from None
    if not out or any(b < 1 for b in out):
        raise argparse.ArgumentTypeError(f"{text!r}: batch sizes are >= 1")
    return out


def _methods(text: str) -> tuple[str, ...]:
    out = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in out if m not in METHODS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown method {bad[0]!r}: use {', '.join(METHODS)}")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cuda (default; pick the GPU with CUDA_VISIBLE_DEVICES: the engine steps on its own thread, "
                         "whose current device is the first) or cpu")
    ap.add_argument("--quick", action="store_true", help="tiny counts: a dry run of every part (CPU tests)")
    ap.add_argument("--batches", type=_ints, default=BATCHES, help="speed table batch sizes (default 1,4,16)")
    ap.add_argument("--methods", type=_methods, default=METHODS, help="speed table methods (default: all)")
    ap.add_argument("--new", type=int, default=None, help="new tokens per request in the table (default 128)")
    ap.add_argument("--waves", type=int, default=None, help="requests per batch row in the table (default 2)")
    ap.add_argument("--dtype", choices=DTYPES, default="float32", help="the table's serving dtype (checks: fp32)")
    ap.add_argument("--samples", type=int, default=None, help="seeded requests of the lossless check (20000)")
    ap.add_argument("--models", type=Path, default=REPO / "examples" / "models", help="the demo family")
    ap.add_argument("--skip", default="", help="parts to skip: identity,lossless,speed")
    ap.add_argument("--json", type=Path, help="also write every result as JSON")
    args = ap.parse_args(argv)
    args.new = args.new or (8 if args.quick else 128)
    args.waves = args.waves or (1 if args.quick else 2)
    args.samples = args.samples or (1500 if args.quick else 20000)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.skip - {"identity", "lossless", "speed"}:
        ap.error(f"--skip takes identity, lossless, speed (got {sorted(args.skip)})")
    if args.quick:
        args.batches = tuple(b for b in args.batches if b <= 4) or (1,)
    return args


# ------------------------------------------------------------------------------------------ device


def sync(device: str) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously: a clock read without it times the launch)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def device_ok(device: str) -> str | None:
    """None when `device` can run, else why not."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        return "CUDA is not available to this PyTorch (torch.cuda.is_available() is False)"
    try:
        torch.zeros(1, device=device)
    except Exception as exc:  # a bad index, a broken driver
        return f"cannot allocate on {device}: {exc}"
    return None


def describe(device: str) -> str:
    import torch

    where = torch.cuda.get_device_name(device) if device.startswith("cuda") else "CPU"
    return (f"device {device} ({where}), torch {torch.__version__}, cuda {torch.version.cuda}, "
            f"tf32 matmul {torch.backends.cuda.matmul.allow_tf32}")


def spec_dict(device: str, method: str, target: Path, *, dtype: str = "float32", batch: int = 4, k: int = 4,
              draft: Path | None = None, heads: Path | None = None, choices=None, adaptive: bool = True,
              max_input_len: int = 64, max_output_len: int = 64, lookahead: dict | None = None) -> dict[str, Any]:
    """A torch-runtime spec on `device` (cuda needs a gpu.type)."""
    sp: dict[str, Any] = {"method": method, "adaptive": {"enabled": adaptive}}
    if method != "none":
        sp["num_draft_tokens"] = k
    if draft is not None:
        sp["draft"] = str(draft)
    if heads is not None:
        sp["heads"] = str(heads)
    if choices is not None:
        sp["choices"] = choices
    if lookahead is not None:
        sp["lookahead"] = lookahead
    return {"schema": 1, "model": {"name": f"gpu-{method}", "target": str(target), "dtype": dtype},
            "speculative": sp,
            "limits": {"max_batch_size": batch, "max_input_len": max_input_len, "max_output_len": max_output_len},
            "runtime": {"kind": "torch", "device": "cuda" if device.startswith("cuda") else "cpu"},
            "gpu": {"type": "h200" if device.startswith("cuda") else "cpu"}}


def engine_for(data: dict[str, Any], device: str):
    """A SpecEngine for a spec dict (its runtime.device: cuda or cpu)."""
    from trtspec import methods
    from trtspec.check import spec_from_dict

    return methods.engine(spec_from_dict(data))


@dataclasses.dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""


def _run(name: str, fn: Callable[[], str], results: list[Check]) -> None:
    """Run one check; a crash is a failed check with its traceback (the other checks still run)."""
    t0 = time.perf_counter()
    try:
        detail = fn()
        results.append(Check(name, True, f"{detail} ({time.perf_counter() - t0:.1f} s)"))
    except AssertionError as exc:
        results.append(Check(name, False, str(exc)))
    except Exception:
        results.append(Check(name, False, traceback.format_exc(limit=6)))
    print(f"{'ok  ' if results[-1].ok else 'FAIL'} {name}: {results[-1].detail}", flush=True)


# ------------------------------------------------------------------------------------------ 1. identity

TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]


def identity_cases(root: Path) -> dict[str, dict[str, Any]]:
    """What tests/runtime/test_engine.py's greedy identity runs, on the tiny family at `root`."""
    return {
        "draft-model": dict(method="draft-model", draft=root / "draft"),
        "draft-model-near": dict(method="draft-model", draft=root / "draft_near"),
        "medusa-chain": dict(method="medusa", heads=root / "medusa", k=3),
        "medusa-tree": dict(method="medusa", heads=root / "medusa", k=6, choices=TREE),
        "eagle-chain": dict(method="eagle", heads=root / "eagle", k=4),
        "eagle-tree": dict(method="eagle", heads=root / "eagle", k=6, choices=TREE),
        "lookahead": dict(method="lookahead", k=4),
    }


def identity_checks(device: str, quick: bool, results: list[Check]) -> None:
    import torch

    from tests.runtime import family
    from trtspec.runtime import SamplingParams

    n_new, n_prompts = (12, 4) if quick else (40, 8)
    tmp = tempfile.TemporaryDirectory(prefix="trtspec-gpu-family-")
    root = family.build_family(Path(tmp.name))
    family.save_noisy_copy(root / "target", root / "draft_near", noise=0.01, seed=7)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, family.VOCAB - 1, (int(m),), generator=g).tolist()
               for m in torch.randint(2, 30, (n_prompts,), generator=g)]
    state: dict[str, Any] = {}

    def reference() -> str:
        from transformers import LlamaForCausalLM

        hf = LlamaForCausalLM.from_pretrained(root / "target").eval().to(device)
        ref = []
        for p in prompts:
            ids = torch.tensor([p], device=device)
            with torch.inference_mode():
                out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, do_sample=False,
                                  eos_token_id=family.EOS, pad_token_id=0)[0, len(p):].tolist()
            ref.append(out[: out.index(family.EOS) + 1] if family.EOS in out else out)
        eng = engine_for(spec_dict(device, "none", root / "target"), device)
        plain = [eng.generate(p, SamplingParams(max_new_tokens=n_new)).tokens for p in prompts]
        assert plain == ref, f"plain decoding differs from transformers' greedy on {device}"
        state["ref"] = ref
        return f"plain decoding = transformers greedy, {n_prompts} prompts x {n_new} tokens"

    _run("identity: plain vs transformers", reference, results)
    if "ref" not in state:
        return
    for case, kw in identity_cases(root).items():
        def one(kw=kw, case=case) -> str:
            eng = engine_for(spec_dict(device, target=root / "target", batch=4, **kw), device)
            drafted = 0
            for k in (None, eng.k_max):
                sp = SamplingParams(max_new_tokens=n_new, num_draft_tokens=k)
                single = [eng.generate(p, sp) for p in prompts]
                assert [r.tokens for r in single] == state["ref"], f"{case} K={k} batch 1 differs from plain"
                batched = eng.generate_batch(prompts, sp)
                assert [r.tokens for r in batched] == state["ref"], f"{case} K={k} batch 4 differs from plain"
                drafted += sum(r.drafted for r in single)
            assert drafted > 0, f"{case} never drafted"
            return f"batch 1 and 4, adaptive and K={eng.k_max}: identical ({drafted} tokens drafted)"

        _run(f"identity: {case}", one, results)
    tmp.cleanup()


# ------------------------------------------------------------------------------------------ 2. lossless


def chi2_z(counts, probs) -> float:
    """Chi-square goodness of fit as a z-score (Wilson-Hilferty); cells expecting < 5 are pooled."""
    import torch

    n = counts.sum().item()
    exp, obs = probs.flatten().double().cpu() * n, counts.flatten().double().cpu()
    small = exp < 5
    if small.any():
        exp, obs = torch.cat([exp[~small], exp[small].sum()[None]]), torch.cat([obs[~small], obs[small].sum()[None]])
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum().item()
    k = int(keep.sum()) - 1
    return ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))


def lossless_checks(device: str, samples: int, results: list[Check]) -> None:
    """Seeded sampled draft-model requests on a vocab-8 pair: P(y1, y2) after the prefill's y0 must be the
    target's (temperature 0.9, top-k 6 on both p and q); with the residual replaced by p, it must not be."""
    import torch

    from tests.runtime import family
    from trtspec.methods.draft_model import DraftModelProposer
    from trtspec.runtime import SamplingParams, SpecEngine, rejection
    from trtspec.runtime.cache import chain_inputs
    from trtspec.runtime.llama import Llama
    from trtspec.runtime.sampling import processed_probs

    tmp = tempfile.TemporaryDirectory(prefix="trtspec-gpu-v8-")
    root = Path(tmp.name)
    kw = dict(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=1, initializer_range=0.6, eos_token_id=None, bos_token_id=None)
    family.save_llama(root / "target", seed=21, **kw)
    family.save_noisy_copy(root / "target", root / "draft", noise=0.6, seed=22)
    sp = SamplingParams(max_new_tokens=3, temperature=0.9, top_k=6, num_draft_tokens=2)
    prompt = [1, 2, 3]

    def counts() -> tuple[Any, Any, float]:
        target = Llama.from_dir(root / "target", device=device)
        eng = SpecEngine(target, DraftModelProposer(root / "draft", device=device), num_draft_tokens=2,
                         max_batch_size=min(samples, 1024), max_input_len=8, max_output_len=8)
        res = eng.generate_batch([prompt] * samples,
                                 [dataclasses.replace(sp, seed=1000 + i) for i in range(samples)])
        c = torch.zeros(8, 8)
        for r in res:
            c[r.tokens[1], r.tokens[2]] += 1

        def dist(seq):
            cache = target.new_cache(1, 32)
            inp = chain_inputs([0], len(seq), device)
            tokens = torch.tensor([seq], device=device)
            lg, _ = target.forward(cache, inp.positions, inp.start, inp.mask, tokens=tokens)
            return processed_probs(lg[0, -1], sp).double().cpu()

        exact = torch.zeros(8, 8, dtype=torch.float64)
        p0 = dist(prompt)
        for y0 in range(8):
            p1 = dist(prompt + [y0])
            for y1 in range(8):
                exact[y1] += p0[y0] * p1[y1] * dist(prompt + [y0, y1])
        acc = sum(r.accepted for r in res) / max(1, sum(r.drafted for r in res))
        return c, exact, acc

    def lossless() -> str:
        c, exact, acc = counts()
        z = chi2_z(c, exact)
        assert 0.2 < acc < 0.9, f"acceptance {acc:.2f}: the pair should both accept and reject"
        assert z < 4.0, f"chi-square z = {z:.2f} >= 4: sampled speculation is not the target's distribution"
        return f"{samples} seeded requests, acceptance {acc:.2f}, chi-square z = {z:.2f} < 4"

    def broken() -> str:
        keep = rejection.residual
        rejection.residual = lambda p, q: p
        try:
            c, exact, _ = counts()
        finally:
            rejection.residual = keep
        z = chi2_z(c, exact)
        threshold = 8.0 if samples >= 10000 else 4.0
        assert z > threshold, f"a broken residual went unnoticed (z = {z:.2f}): the check cannot fail"
        return f"broken residual caught: z = {z:.2f} > {threshold:g}"

    _run("lossless: sampled draft-model", lossless, results)
    _run("lossless: the check catches a broken residual", broken, results)
    tmp.cleanup()


# ------------------------------------------------------------------------------------------ 3. speed


@dataclasses.dataclass
class Row:
    method: str
    batch: int
    k: int
    tok_s: float
    speedup: float
    tokens_per_step: float
    acceptance: float
    same: bool


def demo_spec(method: str, models: Path, device: str, batch: int, dtype: str, new: int) -> dict[str, Any]:
    """examples/demo/<method>.toml's drafter settings on `device` (method none: plain decoding)."""
    src = tomllib.loads((REPO / "examples" / "demo" / f"{method if method != 'none' else 'draft-model'}.toml")
                        .read_text(encoding="utf-8"))
    s = src["speculative"]
    kw: dict[str, Any] = {"k": s.get("num_draft_tokens", 4), "choices": s.get("choices"), "adaptive": False,
                          "lookahead": s.get("lookahead") if method == "lookahead" else None}
    if method == "draft-model":
        kw["draft"] = models / "draft"
    elif method in ("medusa", "eagle"):
        kw["heads"] = models / method
    return spec_dict(device, method, models / "target", dtype=dtype, batch=batch, max_input_len=128,
                     max_output_len=new, **kw)


def demo_prompts(tokenizer, n: int, models: Path, length: int = 64) -> list[list[int]]:
    """n prompts of `length` tokens: the demo family's held-out stdlib snippets, or (another Python's stdlib
    lacks those files) snippets of trtspec's own source, which every checkout has."""
    try:
        from trtspec.train.data import heldout_prompts

        texts = heldout_prompts(n, prompt_tokens=length, models_dir=models)
        return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    except Exception as exc:
        print(f"(held-out prompts unavailable: {exc}; using snippets of trtspec's source)")
    out: list[list[int]] = []
    for path in sorted((REPO / "trtspec").rglob("*.py")):
        ids = tokenizer(path.read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
        out += [ids[i:i + length] for i in range(0, len(ids) - length, 4 * length)]
        if len(out) >= n:
            return out[:n]
    return (out * (n // max(1, len(out)) + 1))[:n]


def timed(eng, prompts, params, device: str) -> tuple[float, list]:
    from trtspec.runtime import SamplingParams

    warm = [p[:16] for p in prompts[: eng.max_batch_size]]
    eng.generate_batch(warm, SamplingParams(max_new_tokens=8, end_id=-1, num_draft_tokens=params.num_draft_tokens))
    sync(device)
    t0 = time.perf_counter()
    res = eng.generate_batch(prompts, params)
    sync(device)
    return time.perf_counter() - t0, res


def speed_rows(device: str, models: Path, methods, batches, new: int, waves: int, dtype: str) -> list[Row]:
    from trtspec.runtime import SamplingParams

    rows: list[Row] = []
    for b in batches:
        plain = engine_for(demo_spec("none", models, device, b, dtype, new), device)
        prompts = demo_prompts(plain.tokenizer, b * waves, models)
        n_tokens = len(prompts) * new
        params = SamplingParams(max_new_tokens=new, end_id=-1, num_draft_tokens=0)
        t_plain, ref = timed(plain, prompts, params, device)
        rows.append(Row("plain", b, 0, n_tokens / t_plain, 1.0, 1.0, 0.0, True))
        print(f"  batch {b:>2} plain: {n_tokens / t_plain:8.1f} tok/s", flush=True)
        del plain
        for m in methods:
            eng = engine_for(demo_spec(m, models, device, b, dtype, new), device)
            t, res = timed(eng, prompts, dataclasses.replace(params, num_draft_tokens=eng.k_max), device)
            steps = sum(r.steps for r in res)
            tau = sum(len(r.tokens) - 1 for r in res) / max(1, steps)  # verify-step tokens (prefill's excluded)
            acc = sum(r.accepted for r in res) / max(1, sum(r.drafted for r in res))
            rows.append(Row(m, b, eng.k_max, n_tokens / t, t_plain / t, tau, acc,
                            [r.tokens for r in res] == [r.tokens for r in ref]))
            print(f"  batch {b:>2} {m}: {n_tokens / t:8.1f} tok/s ({t_plain / t:.2f}x)", flush=True)
            del eng
    return rows


def format_table(rows: list[Row], title: str = "") -> str:
    """The speedup table as markdown: one line per (method, batch)."""
    head = "| method | batch | K | tok/s | x plain | tokens/step | acceptance | same as plain |"
    lines = ([title, ""] if title else []) + [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.method} | {r.batch} | {r.k or '-'} | {r.tok_s:.1f} | {r.speedup:.2f} | "
                     f"{r.tokens_per_step:.2f} | {r.acceptance:.2f} | {'yes' if r.same else 'NO'} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    why = device_ok(args.device)
    if why:
        print(f"gpu-check: {why}", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 checks compare exact greedy decisions
    torch.manual_seed(0)
    t0 = time.perf_counter()
    print(describe(args.device), flush=True)
    results: list[Check] = []
    if "identity" not in args.skip:
        identity_checks(args.device, args.quick, results)
    if "lossless" not in args.skip:
        lossless_checks(args.device, args.samples, results)
    rows: list[Row] = []
    if "speed" not in args.skip:
        if not (args.models / "target" / "config.json").is_file():
            results.append(Check("speed", False, f"no demo family at {args.models}"))
        else:
            def speed() -> str:
                rows.extend(speed_rows(args.device, args.models, args.methods, args.batches, args.new, args.waves,
                                       args.dtype))
                return f"{len(rows)} rows"

            _run("speed table", speed, results)
    title = (f"demo family on {args.device}, {args.dtype}, greedy, fixed K, {args.new} new tokens, "
             f"{args.waves} requests per batch row")
    if rows:
        print()
        print(format_table(rows, title))
    failed = [r for r in results if not r.ok]
    print(f"\n{len(results) - len(failed)}/{len(results)} checks passed in {time.perf_counter() - t0:.0f} s"
          + (f"; FAILED: {', '.join(r.name for r in failed)}" if failed else ""))
    if args.json:
        data = {"device": describe(args.device), "checks": [dataclasses.asdict(r) for r in results],
                "rows": [dataclasses.asdict(r) for r in rows]}
        args.json.write_text(json.dumps(data, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
