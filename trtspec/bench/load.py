"""Load-aware benchmark: a concurrency x K grid measured in one run
(`trtspec bench --concurrency ... --num-draft-tokens ...`).

Each grid point sends the same prompts with `concurrency` clients at once (closed loop: a client sends its
next request when its previous one ended), every request with one fixed K (`num_draft_tokens`; 0 = no
speculation; None = the deployment's own choice: adaptive K under its schedule). Points run one after the
other, K inner, so that drifting machine load hits neighbouring K alike.

Per point: requests/s, output tokens/s (over the point's wall time), TTFT and inter-token latency p50/p90/p99,
acceptance, tokens per step, per-position acceptance, the speedup over K = 0 at the same concurrency, the
ideal speedup and greedy mismatches against K = 0. Definitions, as AIPerf/genai-perf use them:

    TTFT = request sent -> first non-empty text; ITL = (request latency - TTFT) / (output tokens - 1)
    ideal speedup = E[tokens/step](a, K) / (1 + K c)   (a = acceptance rate, c = IDEAL_DRAFT_COST, nominal)
    per-position acceptance[i] = steps whose i-th draft token was accepted / steps that drafted

Per-position counts come from the engine's step stats (in-process) or from the server's
`spec_dec_accepted_tokens_per_position_total` / `spec_dec_drafts_total` counters (served, when the metrics
URL is known; the deltas over the point, parsed with prometheus_client's parser).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from trtspec.errors import GenerationError
from trtspec.runtime.stats import acceptance_rate, tokens_per_step

# the ideal speedup's nominal cost of one draft token in decode steps (a display figure: the engine prices K
# with the costs it measured, runtime/costs.py)
IDEAL_DRAFT_COST = 0.15

AUTO = None  # K of a point: the deployment's own (adaptive, scheduled)


@dataclasses.dataclass
class Outcome:
    """One request as the load generator saw it."""

    text: str
    tokens: int
    seconds: float
    ttft: float | None
    drafted: int
    accepted: int
    steps: int


# (prompt, K) -> Outcome; called from `concurrency` threads at once
Send = Callable[[str, "int | None"], Outcome]


@dataclasses.dataclass
class Point:
    concurrency: int
    k: int | None
    requests: int = 0
    tokens: int = 0
    wall: float = 0.0
    ttfts: list[float] = dataclasses.field(default_factory=list)
    itls: list[float] = dataclasses.field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    per_position: list[float] | None = None  # acceptance per draft position (None: not measured)
    mismatches: int | None = None            # greedy outputs different from K = 0's (None: no K = 0 point)
    speedup: float | None = None             # output tok/s over K = 0's at the same concurrency
    texts: list[str] = dataclasses.field(default_factory=list, repr=False)

    @property
    def label(self) -> str:
        return "auto" if self.k is None else str(self.k)

    @property
    def requests_per_second(self) -> float:
        return self.requests / self.wall if self.wall else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.wall if self.wall else 0.0

    @property
    def acceptance(self) -> float:
        return acceptance_rate(self.accepted, self.drafted)

    @property
    def tokens_per_step(self) -> float:
        return tokens_per_step(max(0, self.tokens - self.requests), self.steps)

    @property
    def mean_k(self) -> float:
        """Draft tokens per verify step (the K the point ran at; for `auto` what adaptive K chose)."""
        return self.drafted / self.steps if self.steps else 0.0

    @property
    def ideal_speedup(self) -> float:
        from trtspec.runtime.adaptive import expected_tokens

        k = self.mean_k
        if not k:
            return 1.0
        return expected_tokens(self.acceptance, round(k)) / (1.0 + k * IDEAL_DRAFT_COST)

    def to_dict(self) -> dict[str, Any]:
        def pcts(xs):
            return {f"p{q}": percentile(xs, q) for q in (50, 90, 99)}

        return {"concurrency": self.concurrency, "num_draft_tokens": self.label, "requests": self.requests,
                "output_tokens": self.tokens, "seconds": self.wall, "requests_per_s": self.requests_per_second,
                "output_tokens_per_s": self.tokens_per_second, "ttft_s": pcts(self.ttfts), "itl_s": pcts(self.itls),
                "acceptance_rate": self.acceptance, "tokens_per_step": self.tokens_per_step, "mean_k": self.mean_k,
                "per_position_acceptance": self.per_position, "speedup": self.speedup,
                "ideal_speedup": self.ideal_speedup, "greedy_mismatches": self.mismatches,
                "drafted": self.drafted, "accepted": self.accepted, "steps": self.steps}


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default, as AIPerf reports them); None with no values."""
    if not values:
        return None
    import numpy as np

    return float(np.percentile(np.asarray(values, dtype=float), q))


@dataclasses.dataclass
class Grid:
    name: str
    method: str
    where: str
    max_tokens: int
    prompts: int
    points: list[Point]

    def point(self, concurrency: int, k: int | None) -> Point | None:
        return next((p for p in self.points if p.concurrency == concurrency and p.k == k), None)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "method": self.method, "where": self.where, "max_tokens": self.max_tokens,
                "prompts": self.prompts, "points": [p.to_dict() for p in self.points]}


def run_point(send: Send, prompts: Sequence[str], concurrency: int, k: int | None,
              positions: Callable[[], Callable[[], list[float] | None]] | None = None) -> Point:
    """Every prompt once, `concurrency` at a time; the first failure fails the point (GenerationError)."""
    point = Point(concurrency, k)
    outcomes: list[Outcome | None] = [None] * len(prompts)
    errors: list[BaseException] = []
    next_index = iter(range(len(prompts)))
    lock = threading.Lock()

    def client() -> None:
        while not errors:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            try:
                outcomes[i] = send(prompts[i], k)
            except BaseException as exc:  # noqa: BLE001 - reported once below
                errors.append(exc)

    finish = positions() if positions else None
    start = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(min(concurrency, len(prompts)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    point.wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    for o in outcomes:
        point.requests += 1
        point.tokens += o.tokens
        point.drafted += o.drafted
        point.accepted += o.accepted
        point.steps += o.steps
        point.texts.append(o.text)
        if o.ttft is not None:
            point.ttfts.append(o.ttft)
            if o.tokens > 1:
                point.itls.append((o.seconds - o.ttft) / (o.tokens - 1))
    point.per_position = finish() if finish else None
    return point


def run_grid(send: Send, prompts: Sequence[str], concurrencies: Sequence[int], ks: Sequence[int | None], *,
             name: str, method: str, where: str, max_tokens: int,
             positions: Callable[[], Callable[[], list[float] | None]] | None = None,
             progress: Callable[[str, int, int], None] | None = None) -> Grid:
    """The grid, after one warm-up request per K (first-call costs are not decoding speed)."""
    if not prompts:
        raise GenerationError("no prompts to benchmark", hint="pass --prompts FILE or builtin:code|chat|edit")
    for k in ks:
        send(prompts[0], k)
    points, total = [], len(concurrencies) * len(ks)
    for c in concurrencies:
        row = []
        for k in ks:
            if progress:
                progress(f"concurrency {c}, K {'auto' if k is None else k}", len(points), total)
            row.append(run_point(send, prompts, c, k, positions))
            points.append(row[-1])
        base = next((p for p in row if p.k == 0), None)
        for p in row:
            if base is not None:
                p.speedup = p.tokens_per_second / base.tokens_per_second if base.tokens_per_second else None
                p.mismatches = sum(a != b for a, b in zip(p.texts, base.texts))
    if progress:
        progress("done", total, total)
    return Grid(name, method, where, max_tokens, len(prompts), points)


# ------------------------------------------------------------------------------------------------ senders

def local_send(engine, max_tokens: int, chat: bool = False) -> Send:
    """Requests to an in-process SpecEngine (its scheduler thread batches the concurrent ones)."""
    from trtspec.artifacts.tokenizer import chat_prompt_ids
    from trtspec.runtime import SamplingParams

    engine.scheduler.start()

    def send(prompt: str, k: int | None) -> Outcome:
        ids = chat_prompt_ids(engine.tokenizer, prompt) if chat else prompt
        r = engine.generate(ids, SamplingParams(max_new_tokens=max_tokens, num_draft_tokens=k))
        return Outcome(r.text, len(r.tokens), r.seconds, r.ttft_seconds, r.drafted, r.accepted, r.steps)

    return send


def local_positions(engine) -> Callable[[], Callable[[], list[float] | None]]:
    """Per-position acceptance from the engine's step stats over a point."""
    def begin():
        counts: list[int] = []
        drafts = [0]

        def observe(stats) -> None:
            drafts[0] += stats.num_drafts
            for n in stats.accepted:
                for i in range(n):
                    if i == len(counts):
                        counts.append(0)
                    counts[i] += 1

        engine.on_step.append(observe)

        def end() -> list[float] | None:
            engine.on_step.remove(observe)
            return [c / drafts[0] for c in counts] if drafts[0] else None

        return end

    return begin


def remote_send(url: str, max_tokens: int, *, model: str = "ensemble", options=None, chat: bool = False,
                timeout: float = 300.0) -> Send:
    from trtspec.client import generate_remote

    def send(prompt: str, k: int | None) -> Outcome:
        messages = [{"role": "user", "content": prompt}] if chat else None
        r = generate_remote(url, prompt, max_tokens=max_tokens, num_draft_tokens=k, timeout=timeout, model=model,
                            options=options, messages=messages)
        return Outcome(r.text, r.new_tokens, r.seconds, r.ttft_seconds, r.total_draft_tokens,
                       r.total_accepted_draft_tokens, r.steps)

    return send


def served_counters(metrics_url: str, method: str | None = None) -> tuple[float, dict[int, float]]:
    """(spec_dec_drafts_total, {position: spec_dec_accepted_tokens_per_position_total}) summed over the models
    (of `method` when given)."""
    from trtspec.serve.control import scrape

    drafts, per_pos = 0.0, {}
    for name, labels, value in scrape(metrics_url):
        if method is not None and labels.get("method") != method:
            continue
        if name == "spec_dec_drafts_total":
            drafts += value
        elif name == "spec_dec_accepted_tokens_per_position_total" and labels.get("position", "").isdigit():
            i = int(labels["position"])
            per_pos[i] = per_pos.get(i, 0.0) + value
    return drafts, per_pos


def remote_positions(metrics_url: str, method: str | None = None) -> Callable[[], Callable[[], list[float] | None]]:
    """Per-position acceptance from the server's counters: their deltas over a point."""
    def begin():
        d0, p0 = served_counters(metrics_url, method)

        def end() -> list[float] | None:
            d1, p1 = served_counters(metrics_url, method)
            drafts = d1 - d0
            if drafts <= 0:
                return None
            out = [(p1.get(i, 0.0) - p0.get(i, 0.0)) / drafts for i in range(max(p1, default=-1) + 1)]
            while out and out[-1] <= 0:
                out.pop()
            return out

        return end

    return begin


def parse_ks(text: str) -> list[int | None]:
    """`0,2,4,auto` -> [0, 2, 4, None]."""
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip()
        if part == "auto":
            out.append(AUTO)
        elif part.isdigit():
            out.append(int(part))
        else:
            raise ValueError(f"{part!r} is not a whole number >= 0 or 'auto'")
    if not out or len(set(out)) != len(out):
        raise ValueError("give each K once")
    return out


def parse_concurrencies(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"{part!r} is not a whole number >= 1")
        out.append(int(part))
    if len(set(out)) != len(out):
        raise ValueError("give each concurrency once")
    return out


def plot_grid(grids: Sequence[Grid], path) -> None:
    """Two panels: speedup over K = 0 and acceptance, each against K, one line per concurrency (and grid)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for g in grids:
        tag = f"{g.method} " if len(grids) > 1 else ""
        for c in sorted({p.concurrency for p in g.points}):
            row = [p for p in g.points if p.concurrency == c]
            xs = [p.mean_k if p.k is None else p.k for p in row]
            if any(p.speedup is not None for p in row):
                ax1.plot(xs, [p.speedup or 0.0 for p in row], marker="o", label=f"{tag}c={c}")
            ax2.plot(xs, [p.acceptance for p in row], marker="o", label=f"{tag}c={c}")
    ax1.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax1.set(xlabel="K (num_draft_tokens; auto: mean K)", ylabel="output tok/s / K=0's", title="speedup")
    ax2.set(xlabel="K (num_draft_tokens; auto: mean K)", ylabel="accepted / drafted", title="acceptance", ylim=(0, 1))
    for ax in (ax1, ax2):
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{grids[0].where}: {grids[0].prompts} prompts x {grids[0].max_tokens} new tokens, greedy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def measure(spec, prompts: Sequence[str], concurrencies: Sequence[int], ks: Sequence[int | None], *,
            max_tokens: int, url: str | None = None, model: str | None = None, metrics_url: str | None = None,
            options=None, chat: bool = False, engine=None,
            progress: Callable[[str, int, int], None] | None = None) -> Grid:
    """The grid for `spec`: in-process (url None; `engine`: an already loaded SpecEngine, else one from the
    spec, closed after) or against the server at `url` (gRPC; `model`: its ensemble, by default the spec's)."""
    if url is None:
        from trtspec import methods

        own = engine is None
        engine = engine or methods.engine(spec)
        try:
            return run_grid(local_send(engine, max_tokens, chat), prompts, concurrencies, ks, name=spec.name,
                            method=spec.method, where="in-process", max_tokens=max_tokens,
                            positions=local_positions(engine), progress=progress)
        finally:
            if own:
                engine.close()
    model = model or spec.serving.ensemble_name
    send = remote_send(url, max_tokens, model=model, options=options, chat=chat)
    positions = remote_positions(metrics_url, spec.method) if metrics_url else None
    return run_grid(send, prompts, concurrencies, ks, name=spec.name, method=spec.method,
                    where=f"served ({url}, {model})", max_tokens=max_tokens, positions=positions, progress=progress)
