"""Speculative vs. plain decoding, measured side by side in one run (in-process or served).

For each prompt, the same request runs with speculation (the spec's drafter, adaptive K) and
without (`num_draft_tokens = 0`), alternating so that machine load hits both alike. The report
holds throughput, latency, time to first token, acceptance and tokens per step, the speedup ratio,
and whether greedy outputs were identical (they must be: speculation is lossless).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable

from trtspec import methods
from trtspec.artifacts.tokenizer import chat_prompt_ids
from trtspec.errors import GenerationError
from trtspec.runtime.stats import acceptance_rate, tokens_per_step
from trtspec.spec import Spec


@dataclasses.dataclass
class RunStats:
    label: str
    requests: int
    new_tokens: int
    seconds: float
    latencies: list[float]
    ttfts: list[float]
    drafted: int
    accepted: int
    steps: int

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def acceptance_rate(self) -> float:
        return acceptance_rate(self.accepted, self.drafted)

    @property
    def tokens_per_step(self) -> float:
        """As trtspec.runtime.stats defines it (each request's first token is its prefill's)."""
        return tokens_per_step(max(0, self.new_tokens - self.requests), self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "requests": self.requests, "new_tokens": self.new_tokens,
                "seconds": self.seconds, "tokens_per_second": self.tokens_per_second,
                "latency_p50_s": _pct(self.latencies, 50), "latency_p90_s": _pct(self.latencies, 90),
                "ttft_p50_s": _pct(self.ttfts, 50), "drafted": self.drafted, "accepted": self.accepted,
                "acceptance_rate": self.acceptance_rate, "tokens_per_step": self.tokens_per_step}


@dataclasses.dataclass
class BenchReport:
    name: str
    method: str
    where: str
    max_tokens: int
    spec: RunStats
    plain: RunStats
    identical: int  # prompts whose greedy outputs were identical
    costs: dict[str, Any] | None = None  # the engine's cost table (in-process runs; runtime/costs.py)

    @property
    def speedup(self) -> float:
        return self.spec.tokens_per_second / self.plain.tokens_per_second if self.plain.tokens_per_second else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "method": self.method, "where": self.where, "max_tokens": self.max_tokens,
                "speculative": self.spec.to_dict(), "plain": self.plain.to_dict(), "speedup": self.speedup,
                "identical_outputs": self.identical, "prompts": self.spec.requests, "costs": self.costs}


def _pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# One request: (prompt, num_draft_tokens) -> (text, new_tokens, seconds, ttft, drafted, accepted, steps)
Runner = Callable[[str, "int | None"], tuple[str, int, float, float | None, int, int, int]]


def local_runner(spec: Spec, max_tokens: int, chat: bool = False) -> Runner:
    """In-process requests; `chat`: each prompt is a user message rendered with the chat template."""
    from trtspec.runtime import SamplingParams

    engine = methods.engine(spec)

    def run(prompt: str, k: int | None):
        ids = chat_prompt_ids(engine.tokenizer, prompt) if chat else prompt
        r = engine.generate(ids, SamplingParams(max_new_tokens=max_tokens, num_draft_tokens=k))
        return r.text, len(r.tokens), r.seconds, r.ttft_seconds, r.drafted, r.accepted, r.steps

    run.costs = engine.costs.to_dict()  # what the engine measured (or was given): shown beside the results
    return run


def remote_runner(url: str, max_tokens: int, timeout: float = 120.0, options=None, chat: bool = False) -> Runner:
    """Requests to the server at `url` (`options`: TLS and headers, trtspec.client.GrpcOptions); `chat`: each
    prompt is sent as a user message (the server renders the chat template)."""
    from trtspec.client import generate_remote

    def run(prompt: str, k: int | None):
        messages = [{"role": "user", "content": prompt}] if chat else None
        r = generate_remote(url, prompt, max_tokens=max_tokens, stream=True, num_draft_tokens=k, timeout=timeout,
                            options=options, messages=messages)
        return (r.text, r.new_tokens, r.seconds, r.ttft_seconds, r.total_draft_tokens,
                r.total_accepted_draft_tokens, r.steps or 0)

    return run


def compare(spec: Spec, prompts: list[str], run: Runner, *, max_tokens: int, where: str,
            progress: Callable[[int, int], None] | None = None) -> BenchReport:
    if not prompts:
        raise GenerationError("no prompts to benchmark", hint="pass --prompts FILE or use the demo family")
    run(prompts[0], None)  # warm-up: first-call costs are not decoding speed
    run(prompts[0], 0)
    stats = {label: RunStats(label, 0, 0, 0.0, [], [], 0, 0, 0) for label in ("spec", "plain")}
    identical = 0
    for i, prompt in enumerate(prompts):
        texts = {}
        for label, k in (("spec", None), ("plain", 0)) if i % 2 == 0 else (("plain", 0), ("spec", None)):
            text, n, seconds, ttft, drafted, accepted, steps = run(prompt, k)
            s = stats[label]
            s.requests += 1
            s.new_tokens += n
            s.seconds += seconds
            s.latencies.append(seconds)
            if ttft is not None:
                s.ttfts.append(ttft)
            s.drafted += drafted
            s.accepted += accepted
            s.steps += steps
            texts[label] = text
        identical += texts["spec"] == texts["plain"]
        if progress:
            progress(i + 1, len(prompts))
    return BenchReport(spec.name, spec.method, where, max_tokens, stats["spec"], stats["plain"], identical,
                       getattr(run, "costs", None))


def default_prompts(spec: Spec, n: int) -> list[str]:
    """Held-out prompts of the demo family when the spec's target is one of it."""
    from trtspec.train.data import heldout_prompts

    return heldout_prompts(n, prompt_tokens=64, models_dir=Path(spec.model.target).parent)


def read_prompts(path: Path) -> list[str]:
    """Prompts from a file: JSON lines with a "prompt" (or "text_input") key, or blank-line separated text."""
    import json

    text = Path(path).read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        return [r.get("prompt", r.get("text_input", "")) for r in rows]
    return [p for p in text.split("\n\n") if p.strip()]


def plot(reports: list[BenchReport], path: Path) -> Path:
    """Bar chart of tokens/s, speculative vs. plain, per report (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(reports), 3.6))
    xs = range(len(reports))
    ax.bar([x - 0.2 for x in xs], [r.plain.tokens_per_second for r in reports], 0.4, label="plain")
    ax.bar([x + 0.2 for x in xs], [r.spec.tokens_per_second for r in reports], 0.4, label="speculative")
    for x, r in zip(xs, reports):
        ax.annotate(f"{r.speedup:.2f}x", (x + 0.2, r.spec.tokens_per_second), ha="center", va="bottom")
    ax.set_xticks(list(xs), [r.method for r in reports])
    ax.set_ylabel("tokens / s")
    ax.set_title(f"{reports[0].where}: {reports[0].max_tokens} new tokens, batch 1, greedy")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)



