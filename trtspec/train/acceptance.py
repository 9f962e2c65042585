"""Acceptance of trained drafters, measured by trtspec's runtime itself: greedy speculative decoding through
SpecEngine at a fixed K (adaptive off), with float32 drafter weights, against the same engine's plain decoding
(every output must equal it).

- `measure`: stage 5 of `trtspec train`, one trained drafter on held-out prompts (never trained on): the
  K-token chain and, for heads, a tree; tokens per verify step and the acceptance rate.
- `measure_family`: the demo family's drafters on held-out corpus snippets, per method and K.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from trtspec.train.recipe import Reporter, TrainConfig, silent
from trtspec.train.samples import prompt_ids, target_engine

TREE = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]]


@contextlib.contextmanager
def fp32_drafters() -> Iterator[None]:
    """Drafters in float32 while measuring, so the numbers do not depend on the CPU's bf16 support."""
    old = os.environ.get("TRTSPEC_DRAFT_DTYPE")
    os.environ["TRTSPEC_DRAFT_DTYPE"] = "float32"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRTSPEC_DRAFT_DTYPE", None)
        else:
            os.environ["TRTSPEC_DRAFT_DTYPE"] = old


@torch.no_grad()
def measure(drafter: Path, target: Path, tok, heldout: list, cfg: TrainConfig, report: Reporter = silent, *,
            method: str, weights: str | None) -> dict:
    """Greedy decoding of held-out prompts through SpecEngine, served by `method` with the drafter's dir
    under the spec key `weights` ("draft" or "heads": the caller asks the method): plain, the K chain and
    the TREE (heads only). tokens_per_step = tokens of verify steps / verify steps."""
    from trtspec.runtime import SamplingParams

    prompts = [prompt_ids(tok, p) for p in heldout[: cfg.eval_prompts]]
    if not prompts:
        return {"prompts": 0, "note": "no held-out prompts (plain-text data)"}
    if weights is None:
        raise ValueError("measuring a drafter needs the spec key of its files (weights='draft' or 'heads')")
    n = cfg.eval_new_tokens
    out: dict[str, Any] = {"prompts": len(prompts), "new_tokens": n,
                           "what": "greedy, batch 1, fixed K, held-out prompts"}
    plans = {"chain": ({"num_draft_tokens": cfg.eval_k}, cfg.eval_k)}
    if weights == "heads":
        plans["tree"] = ({"num_draft_tokens": len(TREE), "choices": TREE}, len(TREE))
    where = {weights: str(Path(drafter).resolve())}
    reference = None
    with fp32_drafters():
        for i, (name, (extra, k)) in enumerate(plans.items()):
            engine = target_engine(target, {"method": method, **where, "adaptive": {"enabled": False}, **extra},
                                   1, max(len(p) for p in prompts), n, cfg.device, tok)
            try:
                if reference is None:
                    reference = [engine.generate(p, SamplingParams(max_new_tokens=n, num_draft_tokens=0)).tokens
                                 for p in prompts]
                res = [engine.generate(p, SamplingParams(max_new_tokens=n, num_draft_tokens=k)) for p in prompts]
            finally:
                engine.close()
            steps = sum(r.steps for r in res)
            drafted, accepted = sum(r.drafted for r in res), sum(r.accepted for r in res)
            out[name] = {"k": k, "tokens_per_step": round(sum(len(r.tokens) - 1 for r in res) / max(1, steps), 3),
                         "acceptance_rate": round(accepted / max(1, drafted), 3),
                         "matches_plain_greedy": f"{sum(r.tokens == t for r, t in zip(res, reference))}/{len(res)}"}
            report("measure", i + 1, len(plans), None)
    return out


def measure_family(root: Path, prompts: list[list[int]], n_new: int, plans: dict[str, Sequence[int]],
                   where: dict[str, dict[str, str]], report: Reporter = silent) -> dict[str, dict]:
    """Greedy speculative decoding of the written demo family at `root` through trtspec's runtime, per method
    (`where[method]`: its spec keys of the family's dirs) and fixed K: τ = new tokens / target forwards
    (prefill counted), acc = accepted / drafted, and how many outputs equal the runtime's plain decoding
    (they all must)."""
    from trtspec import methods
    from trtspec.artifacts.tokenizer import load_tokenizer
    from trtspec.runtime import SamplingParams
    from trtspec.spec import spec_from_dict

    tok = load_tokenizer(root / "target")
    out: dict[str, dict] = {}
    reference: list[list[int]] | None = None
    with fp32_drafters():
        for i, (method, ks) in enumerate(plans.items()):
            spec = spec_from_dict({
                "schema": 1, "model": {"name": f"demo-{method}", "target": "target", "dtype": "float32"},
                "speculative": {"method": method, "num_draft_tokens": max(ks), **where[method],
                                "adaptive": {"enabled": False}},
                "limits": {"max_batch_size": 1, "max_input_len": max(len(p) for p in prompts),
                           "max_output_len": n_new},
                "runtime": {"kind": "torch", "device": "cpu"}}, base=root)
            engine = methods.engine(spec, tokenizer=tok)
            try:
                if reference is None:
                    plain = SamplingParams(max_new_tokens=n_new, end_id=-1, num_draft_tokens=0)
                    reference = [engine.generate(p, plain).tokens for p in prompts]
                out[method] = {}
                for k in ks:
                    sp = SamplingParams(max_new_tokens=n_new, end_id=-1, num_draft_tokens=k)
                    results = [engine.generate(p, sp) for p in prompts]
                    drafted, accepted = sum(r.drafted for r in results), sum(r.accepted for r in results)
                    same = sum(r.tokens == ref for r, ref in zip(results, reference))
                    out[method][str(k)] = {
                        "tau": round(sum(len(r.tokens) for r in results) / sum(r.steps + 1 for r in results), 3),
                        "acceptance_rate": round(accepted / max(1, drafted), 3),
                        "matches_plain_greedy": f"{same}/{len(prompts)}"}
            finally:
                engine.close()
            report("measure", i + 1, len(plans), None)
    return out
