"""Qwen2.5-Coder-1.5B-Instruct drafted by its 0.5B sibling: every variant side by side, in one run, per prompt set.

    .venv/bin/python bench/bench_qwen.py [--rows hf-plain,plain,draft] [--sets code,chat] [--prompts 4]
                                         [--new 128] [--threads 2] [--paired] [--json out.json]

Needs `make qwen` (the bf16 imports in examples/models/qwen2.5-coder-{1.5b,0.5b}-instruct/). Prompt sets:
examples/qwen/{code,edit,chat}.jsonl (code completion, edit/rewrite of a given text, open chat), each prompt a user
message rendered with the chat template; greedy, batch 1, up to --new tokens or the EOS. Rows (--rows, all by
default):

  hf-plain          transformers' greedy generate on the bf16 target
  hf-assisted       transformers' assisted generation with the 0.5B draft, constant K = 4 (no confidence cut-off)
  hf-plain-fp32     transformers' greedy generate on the target in float32, compared with plain-fp32
  hf-plain-rowexact transformers' bf16 greedy generate with every nn.Linear multiplied by trtspec's row-exact bf16
                    matmul (runtime/linear.py's Linear, as trtspec's target calls it) and nothing else changed,
                    compared with hf-plain: how far a greedy bf16 text follows the matmul kernel's summation order
  plain             trtspec, the torch runtime in-process (examples/qwen/plain.toml)
  plain-fp32        the same spec served in float32 (model.dtype = "float32": 6.2 GB of weights)
  draft             draft-model, constant K = 4 (examples/qwen/draft-model.toml, adaptive K off)
  draft-int8        the same with the weight-only int8 drafter (draft-model-int8-draft.toml)
  draft-w8a8        the same with the W8A8 drafter (draft-model-w8a8-draft.toml)
  draft-w4a8        the same with the W4A8 drafter (draft-model-w4a8-draft.toml: 4-bit weights, int8 activations)
  draft-w4a8-k8     the same spec with K up to 8 and its adaptive K (the measured costs pick K each step): where
                    drafts run long (edits), more than the 5 tokens a step that a constant K = 4 allows
  ngram, suffix, lookahead   the training-free drafters (examples/qwen/<name>.toml)
  eagle3            the EAGLE-3 head `make qwen-eagle3` trains for the target (examples/qwen/eagle3.toml), a chain of
                    up to K = 4 with the spec's adaptive K (it has no peer row to match a constant K; the cost model
                    turns a head that does not pay off); skipped until it is trained. Its training cost is printed
                    under the tables
  plain-int8        trtspec plain with the weight-only int8 target (plain-int8.toml): its own model, so its identity
                    column says how far its text follows the bf16 target's
  draft-both-int8   draft-model with the int8 target and the int8 drafter (draft-model-int8.toml), compared with
                    plain-int8 (its own plain decoding) for speed and identity; K by the spec's adaptive K (the
                    measured costs), as every quantized pair (no peer row to match a constant K)
  draft-int8-w4a8   the int8 target with the W4A8 drafter (draft-model-int8-w4a8-draft.toml), compared with
                    plain-int8: the int8 path of an AVX2-only CPU with its cheapest drafter
  plain-w8a8        trtspec plain with the W8A8 target (plain-w8a8.toml: int8 weights and int8 activations per
                    token, integer sums): its own model, as plain-int8
  draft-both-w8a8   draft-model with the W8A8 target and the W8A8 drafter (draft-model-w8a8.toml), compared with
                    plain-w8a8
  plain-w4a8        trtspec plain with the W4A8 target (plain-w4a8.toml: 4-bit weights in groups of 32, int8
                    activations per token, integer sums): its own model, as plain-int8
  draft-both-w4a8   draft-model with the W4A8 target and the W4A8 drafter (draft-model-w4a8.toml), compared with
                    plain-w4a8
  served-plain, served-draft the plain and draft-model deployments served by the bundled Triton (gRPC streaming,
                    the chat sent as `messages`)
  served-draft-both-int8     the int8 pair (draft-model-int8.toml) served the same way, compared with plain-int8
  served-draft-both-w8a8     the W8A8 pair (draft-model-w8a8.toml) served the same way, compared with plain-w8a8
  served-draft-both-w4a8     the W4A8 pair (draft-model-w4a8.toml) served the same way, compared with plain-w4a8
  llamacpp-plain, llamacpp-draft  llama.cpp on the same GGUF files, when the `xllamacpp` wheel is importable

Every row runs in a fresh process (its peak RSS is its own; one model pair in memory at a time). Columns: tok/s
(new tokens / wall seconds), x trtspec plain (of its own plain row for the int8, W8A8 and W4A8 pairs), x transformers
plain, tau (tokens per target pass after the prefill: trtspec's runtime/stats.py definition; transformers: new
tokens / target forward passes), alpha (accepted / drafted tokens), per-position acceptance (share of drafts whose
accepted path reaches position i), c (the draft cost: the drafter's seconds per drafted token / the target's plain
seconds per token, from the plain row; the quantized plain row's for a quantized pair), identity with trtspec plain
decoding (same tokens; served rows: same text), peak RSS (the row's process; served: tritonserver and its stubs,
sampled after each request). A script that prints a table, never a test.

--paired also decodes every prompt of an in-process speculative row plainly, right after its speculative run, in
the same process and engine (its target, K = 0), and adds the column `x paired plain`: the ratio of the two,
measured seconds apart, so the drift of a VM between rows' processes (+-30 % here) does not enter it. It makes
those rows about twice as long.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import cpu_model, jsonl_prompts, vector_flags  # noqa: E402

EXAMPLES = Path(os.environ.get("BENCH_QWEN_EXAMPLES", REPO / "examples"))  # --examples (the rows' processes read it)
QWEN = EXAMPLES / "qwen"
TARGET = EXAMPLES / "models" / "qwen2.5-coder-1.5b-instruct"
DRAFT = EXAMPLES / "models" / "qwen2.5-coder-0.5b-instruct"
HEAD = EXAMPLES / "models" / "qwen2.5-coder-1.5b-instruct-eagle3"
GGUF = {"target": REPO / ".cache/qwen/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        "draft": REPO / ".cache/qwen/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}
SETS = ("code", "edit", "chat")
K = 4
SPECS = {"plain": "plain", "plain-fp32": "plain", "draft": "draft-model", "draft-int8": "draft-model-int8-draft",
         "draft-w8a8": "draft-model-w8a8-draft", "draft-w4a8": "draft-model-w4a8-draft",
         "draft-w4a8-k8": "draft-model-w4a8-draft", "ngram": "ngram",
         "suffix": "suffix", "lookahead": "lookahead", "eagle3": "eagle3", "served-plain": "plain",
         "served-draft": "draft-model", "plain-int8": "plain-int8", "draft-both-int8": "draft-model-int8",
         "draft-int8-w4a8": "draft-model-int8-w4a8-draft",
         "plain-w8a8": "plain-w8a8", "draft-both-w8a8": "draft-model-w8a8", "plain-w4a8": "plain-w4a8",
         "draft-both-w4a8": "draft-model-w4a8"}
ROWS = ("hf-plain", "hf-assisted", "hf-plain-fp32", "hf-plain-rowexact", "plain", "plain-fp32", "draft",
        "draft-int8", "draft-w8a8", "draft-w4a8", "draft-w4a8-k8", "ngram", "suffix", "lookahead", "eagle3",
        "plain-int8", "draft-both-int8", "draft-int8-w4a8", "plain-w8a8",
        "draft-both-w8a8", "plain-w4a8", "draft-both-w4a8", "served-plain", "served-draft", "served-draft-both-int8",
        "served-draft-both-w8a8", "served-draft-both-w4a8", "llamacpp-plain", "llamacpp-draft")
# rows over another target than bf16 plain's (or transformers' own variants): compared with their own plain row
OWN_PLAIN = {"draft-both-int8": "plain-int8", "served-draft-both-int8": "plain-int8",
             "draft-int8-w4a8": "plain-int8",
             "draft-both-w8a8": "plain-w8a8", "served-draft-both-w8a8": "plain-w8a8",
             "draft-both-w4a8": "plain-w4a8", "served-draft-both-w4a8": "plain-w4a8",
             "hf-plain-fp32": "plain-fp32", "hf-plain-rowexact": "hf-plain"}


def _totals() -> dict:
    return {"outputs": [], "texts": [], "tokens": 0, "seconds": 0.0, "steps": 0, "step_tokens": 0, "drafted": 0,
            "accepted": 0, "draft_seconds": 0.0, "per_position": [], "drafts": 0, "paired_tokens": 0,
            "paired_seconds": 0.0, "paired_same": 0}


def _add(m: dict, tokens: list[int], seconds: float, **counts) -> None:
    m["outputs"].append(list(tokens))
    m["tokens"] += len(tokens)
    m["seconds"] += seconds
    for k, v in counts.items():
        m[k] += v


ADAPTIVE_K = {"draft-w4a8-k8": 8}  # rows that raise their spec's K and keep its adaptive K


def _spec(name: str):
    from trtspec.check import load_spec

    spec = load_spec(QWEN / f"{SPECS[name]}.toml")
    if name == "plain-fp32":
        return spec.model_copy(update={"model": spec.model.model_copy(update={"dtype": "float32"})})
    if name in ADAPTIVE_K:
        return spec.model_copy(update={"speculative": spec.speculative.model_copy(
            update={"num_draft_tokens": ADAPTIVE_K[name]})})
    if spec.speculative.method == "draft-model" and spec.model.quantization is None:
        # constant K, as transformers' assisted row (a quantized pair has no peer row: its spec's adaptive K)
        adaptive = spec.speculative.adaptive.model_copy(update={"enabled": False})
        spec = spec.model_copy(update={"speculative": spec.speculative.model_copy(update={"adaptive": adaptive})})
    return spec


def run_row(row: str, prompts: dict[str, list[str]], new: int, threads: int) -> dict:
    """One row over every set, in this (fresh) process: {set: totals} + this process's peak RSS."""
    import torch

    torch.set_num_threads(threads)
    if row.startswith("hf-"):
        out = _hf(row, prompts, new)
    elif row.startswith("served-"):
        out = _served(row, prompts, new)
    elif row.startswith("llamacpp-"):
        out = _llamacpp(row, prompts, new)
    else:
        out = _trtspec(row, prompts, new)
    out.setdefault("peak_rss_gb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)
    return out


def _ids(tokenizer, prompts: dict[str, list[str]]) -> dict[str, list[list[int]]]:
    from trtspec.artifacts.tokenizer import chat_prompt_ids

    return {name: [chat_prompt_ids(tokenizer, p) for p in ps] for name, ps in prompts.items()}


def _trtspec(row: str, prompts: dict[str, list[str]], new: int) -> dict:
    from trtspec import methods
    from trtspec.runtime import SamplingParams

    spec = _spec(row)
    engine = methods.engine(spec)
    paired = os.environ.get("BENCH_QWEN_PAIRED") == "1" and spec.speculative.method != "none"
    live = _totals()  # the warm-up's steps land here and are dropped

    def observe(step) -> None:  # per-position acceptance, summed over the steps of the current set
        pp = live["per_position"]
        pp.extend([0] * (len(step.accepted_per_position) - len(pp)))
        for i, n in enumerate(step.accepted_per_position):
            pp[i] += n
        live["drafts"] += step.num_drafts

    engine.on_step.append(observe)
    sets = _ids(engine.tokenizer, prompts)
    engine.generate(sets[next(iter(sets))][0], SamplingParams(max_new_tokens=8))  # warm-up
    out = {}
    for name, id_lists in sets.items():
        live = out[name] = _totals()
        for ids in id_lists:
            r = engine.generate(ids, SamplingParams(max_new_tokens=new))
            _add(live, r.tokens, r.seconds, steps=r.steps, step_tokens=len(r.tokens) - 1, drafted=r.drafted,
                 accepted=r.accepted, draft_seconds=r.draft_seconds)
            if paired:  # the same prompt decoded plainly by the same engine, right after (--paired)
                p = engine.generate(ids, SamplingParams(max_new_tokens=new, num_draft_tokens=0))
                live["paired_tokens"] += len(p.tokens)
                live["paired_seconds"] += p.seconds
                live["paired_same"] += p.tokens == r.tokens
    engine.close()
    return out


class _Calls:
    """Forward passes (and their seconds) of one module, counted by hooks."""

    def __init__(self, module) -> None:
        self.calls, self.seconds, self._t = 0, 0.0, 0.0
        module.register_forward_pre_hook(lambda *a: setattr(self, "_t", time.perf_counter()))
        module.register_forward_hook(lambda *a: self._done())

    def _done(self) -> None:
        self.calls += 1
        self.seconds += time.perf_counter() - self._t


def _hf(row: str, prompts: dict[str, list[str]], new: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench._common import run_transformers
    from trtspec.artifacts.hf import ModelConfig

    tok = AutoTokenizer.from_pretrained(TARGET)
    eos = sorted(ModelConfig.from_dir(TARGET).eos_token_ids)
    model = AutoModelForCausalLM.from_pretrained(
        TARGET, dtype=torch.float32 if row == "hf-plain-fp32" else torch.bfloat16).eval()
    if row == "hf-plain-rowexact":
        _row_exact_linears(model)
    kw, draft_calls = {}, None
    if row == "hf-assisted":
        draft = AutoModelForCausalLM.from_pretrained(DRAFT, dtype=torch.bfloat16).eval()
        draft.generation_config.num_assistant_tokens = K
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
        kw = {"assistant_model": draft}
        draft_calls = _Calls(draft)
    calls = _Calls(model)
    sets = _ids(tok, prompts)
    run_transformers(model, sets[next(iter(sets))][0], 8, eos, **kw)  # warm-up
    out = {}
    for name, id_lists in sets.items():
        m = out[name] = _totals()
        for ids in id_lists:
            c0, d0, s0 = calls.calls, draft_calls.calls if draft_calls else 0, draft_calls.seconds if draft_calls else 0
            tokens, seconds = run_transformers(model, ids, new, eos, **kw)
            passes = calls.calls - c0
            drafted = (draft_calls.calls - d0) if draft_calls else 0
            _add(m, tokens, seconds, steps=passes, step_tokens=len(tokens), drafted=drafted,
                 accepted=max(0, len(tokens) - passes) if draft_calls else 0,
                 draft_seconds=(draft_calls.seconds - s0) if draft_calls else 0.0)
    return out


def _row_exact_linears(model) -> None:
    """Every nn.Linear of `model` multiplied by trtspec's row-exact matmul (runtime/linear.py's Linear: oneDNN,
    prepacked, in the row blocks its probe finds), bias inside the call as nn.Linear has it; nothing else changes."""
    import torch

    from trtspec.runtime.linear import Linear

    for mod in model.modules():
        if isinstance(mod, torch.nn.Linear):
            lin = Linear(mod.weight.data, None if mod.bias is None else mod.bias.data, single_row=True)
            mod.forward = lin.__call__


def _served(row: str, prompts: dict[str, list[str]], new: int) -> dict:
    from bench._common import served_deployment
    from bench.soak import server_rss
    from trtspec.client import generate_remote

    out, peak = {}, 0.0
    with served_deployment(_spec(row.removeprefix("served-")), "bench-qwen-") as server:
        generate_remote(server.grpc_url, "", messages=[{"role": "user", "content": "hi"}], max_tokens=8, timeout=300)
        for name, ps in prompts.items():
            m = out[name] = _totals()
            for p in ps:
                r = generate_remote(server.grpc_url, "", messages=[{"role": "user", "content": p}], max_tokens=new,
                                    timeout=900)
                m["texts"].append(r.text)
                m["tokens"] += r.new_tokens
                m["seconds"] += r.seconds
                m["steps"] += r.steps
                m["step_tokens"] += max(0, r.new_tokens - 1)
                m["drafted"] += r.total_draft_tokens
                m["accepted"] += r.total_accepted_draft_tokens
                peak = max(peak, server_rss(server)[0] / 1024)
    out["peak_rss_gb"] = peak
    return out


def _llamacpp(row: str, prompts: dict[str, list[str]], new: int) -> dict:
    """llama.cpp's server in-process (the `xllamacpp` wheel) on the same GGUF files: its chat completions, greedy
    (top-k 1); with the 0.5B draft at a constant K (`-md`, --draft-min = --draft-max = K, no p-min cut-off)."""
    import xllamacpp as xlc

    params = xlc.CommonParams()
    params.model.path = str(GGUF["target"])
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = torch_threads()
    params.n_ctx, params.n_parallel, params.sampling.top_k = 4096, 1, 1
    if row == "llamacpp-draft":
        params.speculative.types = [xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
        draft = params.speculative.draft
        draft.mparams.path = str(GGUF["draft"])
        draft.n_max, draft.n_min, draft.p_min = K, K, 0.0
        draft.cpuparams.n_threads = draft.cpuparams_batch.n_threads = torch_threads()
    server = xlc.Server(params)
    out = {}
    for name, ps in prompts.items():
        m = out[name] = _totals()
        for p in ps:
            t = time.perf_counter()
            r = server.handle_chat_completions({"messages": [{"role": "user", "content": p}], "max_tokens": new,
                                                "temperature": 0.0, "top_k": 1})
            m["seconds"] += time.perf_counter() - t
            m["texts"].append(r["choices"][0]["message"]["content"])
            m["tokens"] += r["usage"]["completion_tokens"]
            timings = r.get("timings") or {}
            m["drafted"] += int(timings.get("draft_n", 0))
            m["accepted"] += int(timings.get("draft_n_accepted", 0))
    del server
    return out


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# --------------------------------------------------------------------------------------------- the table

def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def show(results: dict[str, dict], sets: list[str], args) -> None:
    from rich.console import Console
    from rich.table import Table

    from trtspec.artifacts.tokenizer import load_tokenizer

    tok = load_tokenizer(TARGET)
    console = Console(width=180)
    cols = ("run", "tok/s", "x trtspec plain", "x transformers plain", "tau", "alpha", "per position", "c",
            "same as plain", "peak RSS GB") + (("x paired plain",) if args.paired else ())
    for name in sets:
        table = Table(title=f"{name}: Qwen2.5-Coder-1.5B-Instruct (bf16) + 0.5B draft, batch 1, greedy, <= {args.new} "
                            f"new tokens, {args.prompts} prompts, {args.threads} threads")
        for c in cols:
            table.add_column(c, justify="left" if c == "run" else "right")
        rate = {row: (r[name]["tokens"] / r[name]["seconds"] if r[name]["seconds"] else 0.0)
                for row, r in results.items() if name in r}
        hf_per_tok = (results["hf-plain"][name]["seconds"] / results["hf-plain"][name]["tokens"]
                      if "hf-plain" in results else None)
        for row, r in results.items():
            if name not in r:
                continue
            m = r[name]
            base = OWN_PLAIN.get(row, "plain")
            plain = results.get(base, {}).get(name)
            per_tok = plain["seconds"] / plain["tokens"] if plain and plain["tokens"] else None
            tau = m["step_tokens"] / m["steps"] if m["steps"] else None
            alpha = m["accepted"] / m["drafted"] if m["drafted"] else None
            pp = "/".join(f"{n / m['drafts']:.2f}" for n in m["per_position"]) if m["drafts"] else "-"
            ref = hf_per_tok if row == "hf-assisted" else per_tok
            c = m["draft_seconds"] / m["drafted"] / ref if m["drafted"] and ref and m["draft_seconds"] else None
            same = "-"
            if plain and row != base:
                if m["outputs"]:
                    same = f"{sum(a == b for a, b in zip(m['outputs'], plain['outputs']))}/{len(m['outputs'])}"
                elif m["texts"]:
                    want = [tok.decode(o, skip_special_tokens=True).strip() for o in plain["outputs"]]
                    same = f"{sum(a.strip() == b for a, b in zip(m['texts'], want))}/{len(m['texts'])} (text)"
            paired = []
            if args.paired:
                paired = ["-"]
                if m.get("paired_seconds") and m["seconds"]:
                    ratio = (m["tokens"] / m["seconds"]) / (m["paired_tokens"] / m["paired_seconds"])
                    paired = [f"{ratio:.2f}x ({m['paired_same']}/{len(m['outputs'])} same)"]
            table.add_row(row, f"{rate[row]:.2f}", _fmt(rate[row] / rate[base] if rate.get(base) else None,
                                                         suffix="x"),
                          _fmt(rate[row] / rate["hf-plain"] if rate.get("hf-plain") else None, suffix="x"),
                          _fmt(tau), _fmt(alpha), pp, _fmt(c), same, _fmt(r.get("peak_rss_gb"), ".1f"), *paired)
        console.print(table)


def machine() -> str:
    flags = " ".join(vector_flags(("avx512_bf16", "avx512f", "avx2", "amx", "avx512_vnni")))
    return f"{cpu_model()}; lscpu flags: {flags or '-'}; {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    ap.add_argument("--prompts", type=int, default=4, help="prompts per set (at most 5)")
    ap.add_argument("--new", type=int, default=128, help="most new tokens per request")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the raw totals here")
    ap.add_argument("--paired", action="store_true", help="also decode each prompt of an in-process speculative "
                    "row plainly in the same process, right after (the column `x paired plain`)")
    ap.add_argument("--examples", type=Path, help="a dir with qwen/ (specs, prompt sets) and models/ in place of "
                    "examples/ (e.g. a tiny pair to try the script)")
    args = ap.parse_args()
    if args.paired:
        os.environ["BENCH_QWEN_PAIRED"] = "1"  # (the rows' processes read it)
    if args.examples:
        os.environ["BENCH_QWEN_EXAMPLES"] = str(args.examples.resolve())
        global QWEN, TARGET, DRAFT
        QWEN, TARGET, DRAFT = (args.examples.resolve() / p for p in (
            "qwen", "models/qwen2.5-coder-1.5b-instruct", "models/qwen2.5-coder-0.5b-instruct"))
    rows, sets = args.rows.split(","), args.sets.split(",")
    bad = [r for r in rows if r not in ROWS] + [s for s in sets if s not in SETS]
    if bad:
        sys.exit(f"error: unknown row or set {bad[0]!r}\nhint: rows: {', '.join(ROWS)}; sets: {', '.join(SETS)}")
    if not (TARGET / "trtspec.import.json").is_file() or not (DRAFT / "trtspec.import.json").is_file():
        sys.exit("error: the Qwen pair is not imported\nhint: run `make qwen`")
    if any(r.startswith("llamacpp") for r in rows) and importlib.util.find_spec("xllamacpp") is None:
        print("llama.cpp rows skipped: the xllamacpp wheel is not installed (pip install xllamacpp)")
        rows = [r for r in rows if not r.startswith("llamacpp")]
    if "eagle3" in rows and not (HEAD / "trtspec.train.json").is_file():
        print("eagle3 row skipped: the head is not trained (make qwen-eagle3)")
        rows = [r for r in rows if r != "eagle3"]
    prompts = {s: jsonl_prompts(QWEN / f"{s}.jsonl", args.prompts) for s in sets}
    print(machine())
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    results: dict[str, dict] = {}
    ctx = multiprocessing.get_context("spawn")
    for row in rows:
        t = time.perf_counter()
        try:
            with ctx.Pool(1) as pool:
                results[row] = pool.apply(run_row, (row, prompts, args.new, args.threads))
        except Exception as exc:  # one row's failure (a missing wheel, a server that did not start) is reported
            print(f"  {row}: failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", flush=True)
            continue
        print(f"  {row}: {time.perf_counter() - t:.0f} s, peak RSS {results[row]['peak_rss_gb']:.1f} GB", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(results))
    show(results, sets, args)
    if "eagle3" in results:
        print(training_cost(HEAD))


def training_cost(head: Path) -> str:
    """How the EAGLE-3 head was trained, from its trtspec.train.json: data, budget and wall time."""
    from trtspec.artifacts import manifest

    meta = manifest.read(head / manifest.FILE_NAMES[manifest.TRAIN], manifest.TRAIN)
    if meta is None:
        return "eagle3 head: no readable training manifest (trtspec.train.json)"
    data, budget = meta["inputs"]["data"], meta["budget"]
    wall = budget["wall_s"]
    return (f"eagle3 head: {data['source']} ({data['mode']}, {data['tokens']:,} tokens, {data['samples']} samples), "
            f"draft vocabulary {meta['draft_vocab_size']}, {budget['steps_done']} steps ({budget['epochs']} epochs); "
            f"wall: data {wall['data'] / 60:.1f} min, features {wall['features'] / 60:.1f} min, "
            f"train {wall['train'] / 60:.1f} min")


if __name__ == "__main__":
    main()
