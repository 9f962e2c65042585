"""What a speculative step costs on the device an engine serves: measured once, then fixed.

Adaptive K (adaptive.py) prices every option with the numbers this module measures:

    verify(n)    seconds of one target pass over n rows in all (the batch's rows, each padded to the longest)
    draft(d, B)  seconds of one draft step of drafter d for B requests together (one level of depth; ngram/suffix:
                 a lookup per request; a draft model: one pass of its own over B rows)

`calibrate` measures them when the engine is made, on its own target, cache and proposer: verify at 1, 2, .. up to
the most rows one request verifies (every ~25 % past 16 rows), then x2, x4 .. up to the batch (a few passes each
over real K/V of a dummy context, the shapes taken round robin, the least kept), and each drafter's draft step
through the engine's own step over dummy requests (the least of a few steps) at 1, 2, 4 .. up to the batch requests:
a draft model's step over B rows is neither B times one row's nor one row's (the W4A8 Qwen drafter of docs/qwen.md:
12.0-13.2 ms for 4 rows against 9.5-10.7 for one), and a step prices the batch's drafting at the batch's size. A
drafter's catch-up, what it costs per token to take in what it missed, is measured too. The least, not the median:
whatever else runs on the machine only adds time, so the fastest round is the one closest to the pass's own cost.
And calibrations on one machine take turns (`one_at_a_time`): a Triton server loads its models at once, and each
would time its passes against the others' loading and timing. Measured on the demo family, served beside three other
deployments, with medians and no turns: one table priced a 5-row pass at 1.88 decode steps and the draft step at
0.08, the same engine loaded alone at 1.10 and 0.38, and adaptive K drafted accordingly (docs/costs.md). The table
is fixed after that, so a seeded sampled request keeps a reproducible K. A table is injected instead, with no timing
at all, by SpecEngine(costs=...) or by the environment variable TRTSPEC_COST_TABLE naming a JSON file of the shape
`CostTable.to_dict` writes:

    {"verify": {"1": 0.012, "2": 0.013, ...}, "draft": {"ngram": 0.0001, "*": 0.002},
     "draft_by_batch": {"draft-model": {"2": 0.0025, "4": 0.0033}}, "catch_up": {"draft-model": 0.0003}}

("*": the draft cost of any drafter the table does not name; optional: "draft_by_batch", a draft step of B
requests together, B >= 2; "catch_up", the seconds per token a drafter takes to catch up a request it has not
followed, such as a draft model's cache after steps that drafted nothing). Between measured row counts verify is
linear; past the largest it grows in proportion to the rows. A draft step is linear between measured batch sizes
and grows in proportion past the largest; a drafter with no batch sizes measured costs its one request's draft
step at every batch.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trtspec.errors import SpecError

try:
    import fcntl
except ImportError:  # not POSIX: calibrations do not take turns
    fcntl = None

log = logging.getLogger(__name__)
ENV = "TRTSPEC_COST_TABLE"
REPEATS = 5          # timed passes per row count (after one untimed warm-up pass of each)
DRAFT_STEPS = 4      # timed steps per drafter (after one untimed step)
DENSE_ROWS = 16      # every row count up to this many is measured
CALIBRATION_CONTEXT = 32  # cached tokens the calibration passes attend to (and the dummy prompt's length)
TURN_WAIT_S = 300.0  # the longest a calibration waits for another's turn to end; then it measures anyway


@dataclasses.dataclass(frozen=True)
class CostTable:
    """Seconds of a target pass by its rows in all, and of one draft step by drafter (see the module doc)."""

    verify: Mapping[int, float]
    draft: Mapping[str, float] = dataclasses.field(default_factory=dict)
    source: str = "measured"
    draft_by_batch: Mapping[str, Mapping[int, float]] = dataclasses.field(default_factory=dict)
    catch_up: Mapping[str, float] = dataclasses.field(default_factory=dict)  # seconds per token, by drafter

    def __post_init__(self) -> None:
        if 1 not in self.verify:
            raise SpecError("a cost table needs verify[1], the cost of a one-row decode step",
                            hint='e.g. {"verify": {"1": 0.01, "5": 0.012}, "draft": {"*": 0.001}}')
        by_batch = list(self.draft_by_batch.values())
        values = [*self.verify.values(), *self.draft.values(), *(v for by in by_batch for v in by.values()),
                  *self.catch_up.values()]
        if any(not isinstance(k, int) or k < 1 for k in [*self.verify, *(b for by in by_batch for b in by)]) or not all(
                isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values):
            raise SpecError("a cost table's rows and batch sizes must be integers >= 1 and its costs finite "
                            "seconds >= 0")
        if self.verify[1] <= 0:
            raise SpecError("a cost table's verify[1] must be > 0 seconds")
        object.__setattr__(self, "verify", dict(sorted(self.verify.items())))
        object.__setattr__(self, "draft", dict(self.draft))
        object.__setattr__(self, "draft_by_batch",
                           {d: dict(sorted(by.items())) for d, by in self.draft_by_batch.items()})
        object.__setattr__(self, "catch_up", dict(self.catch_up))
        # what pricing reads at every step of every request, made once: the draft steps' points by drafter
        object.__setattr__(self, "_draft_points", {d: {1: self.draft_seconds(d), **by}
                                                   for d, by in self.draft_by_batch.items()})

    def verify_seconds(self, rows: int) -> float:
        """One pass over `rows` rows: measured, linear between measured row counts, proportional past them."""
        return _interpolate(self.verify, rows)

    def draft_seconds(self, drafter: str, batch: int = 1) -> float:
        """One draft step of `drafter` for `batch` requests together (the table's "*" entries, else 0, for a
        drafter it does not name): measured, linear between measured batch sizes, proportional past them; a
        drafter with no batch sizes measured costs one request's step at every batch."""
        points = self._draft_points.get(drafter, self._draft_points.get("*")) if batch > 1 else None
        return self.draft.get(drafter, self.draft.get("*", 0.0)) if points is None else _interpolate(points, batch)

    def catch_up_seconds(self, drafter: str) -> float:
        """Seconds per token `drafter` takes to catch up a request it has not followed (0: it never lags)."""
        return self.catch_up.get(drafter, self.catch_up.get("*", 0.0))

    def to_dict(self) -> dict[str, Any]:
        out = {"verify": {str(k): v for k, v in self.verify.items()}, "draft": dict(self.draft),
               "source": self.source}
        if self.draft_by_batch:
            out["draft_by_batch"] = {d: {str(b): s for b, s in by.items()} for d, by in self.draft_by_batch.items()}
        if self.catch_up:
            out["catch_up"] = dict(self.catch_up)
        return out

    @classmethod
    def from_dict(cls, data: Any, source: str = "injected") -> CostTable:
        by_batch = data.get("draft_by_batch", {}) if isinstance(data, dict) else None
        if not isinstance(data, dict) or not isinstance(data.get("verify"), dict) or not isinstance(
                data.get("draft", {}), dict) or not isinstance(by_batch, dict) or not all(
                isinstance(by, dict) for by in by_batch.values()) or not isinstance(data.get("catch_up", {}), dict):
            raise SpecError("a cost table is a JSON object with a \"verify\" object (rows -> seconds) and "
                            "optional objects \"draft\" (drafter -> seconds), \"draft_by_batch\" (drafter -> "
                            "{batch size -> seconds}) and \"catch_up\" (drafter -> seconds per token)")
        try:
            verify = {int(k): v for k, v in data["verify"].items()}
            by = {str(d): {int(b): v for b, v in per.items()} for d, per in by_batch.items()}
        except ValueError:
            raise SpecError("a cost table's verify keys must be row counts and its draft_by_batch keys batch "
                            "sizes (integers)") from None
        return cls(verify, {str(k): v for k, v in data.get("draft", {}).items()}, source, by,
                   {str(k): v for k, v in data.get("catch_up", {}).items()})

    def rows(self) -> list[tuple[int, float, float]]:
        """(rows, seconds, relative to one row) per measured row count, for display."""
        one = self.verify[1]
        return [(n, s, s / one) for n, s in self.verify.items()]


def _interpolate(points: Mapping[int, float], x: int) -> float:
    """points (sorted keys, including 1) at x: measured, linear between, in proportion to x past the largest."""
    xs = list(points)
    if x in points:
        return points[x]
    if x > xs[-1]:
        return points[xs[-1]] * x / xs[-1]
    i = bisect.bisect_left(xs, x)
    lo, hi = xs[i - 1], xs[i]
    return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)


def from_env() -> CostTable | None:
    """The table the environment injects (TRTSPEC_COST_TABLE: a JSON file), else None."""
    path = os.environ.get(ENV)
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise SpecError(f"{ENV}={path}: cannot read a JSON cost table ({exc})",
                        hint="unset it to measure the costs, or point it at a file `trtspec bench --local` "
                             "would print") from None
    return CostTable.from_dict(data, source=path)


def row_counts(max_rows: int, max_batch: int) -> list[int]:
    """The row counts calibration measures: 1 .. max_rows (the most one request verifies; past DENSE_ROWS only
    every ~25 %, so a large tree stays cheap to measure), then max_rows x2, x4 .. up to max_rows x max_batch."""
    max_rows = max(1, max_rows)
    counts = list(range(1, min(max_rows, DENSE_ROWS) + 1))
    n = DENSE_ROWS
    while n * 5 // 4 < max_rows:
        n = n * 5 // 4
        counts.append(n)
    if max_rows > DENSE_ROWS:
        counts.append(max_rows)
    return counts + [b * max_rows for b in batch_sizes(max_batch)]


def batch_sizes(max_batch: int) -> list[int]:
    """The batch sizes past 1 calibration measures: 2, 4 .. up to max_batch (and max_batch); a drafter's step at
    each, and verify at each times the most rows one request verifies."""
    sizes, b = [], 2
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return sizes + [max_batch] if max_batch > 1 else []


def shape(rows: int, max_rows: int) -> tuple[int, int]:
    """The [batch, T] of the calibration pass over `rows` rows: one request up to max_rows, then requests of
    max_rows each."""
    return (1, rows) if rows <= max_rows else (rows // max_rows, max_rows)


def measure(passes: Mapping[int, Callable[[], Any]], repeats: int = REPEATS) -> dict[int, float]:
    """The least seconds of each callable: one untimed warm-up call each, then `repeats` rounds, the
    callables taken round robin in every round (so a slow stretch of the machine spreads over all of them)."""
    for run in passes.values():
        run()
    times: dict[int, list[float]] = {key: [] for key in passes}
    for _ in range(repeats):
        for key, run in passes.items():
            t0 = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - t0)
    return {key: min(ts) for key, ts in times.items()}


def calibrate(engine, drafters: Sequence[str], repeats: int = REPEATS, draft_steps: int = DRAFT_STEPS
              ) -> CostTable:
    """Measure `engine`'s (a SpecEngine with nothing running) verify cost by rows and each drafter's draft step
    (`drafters`: the names of a routed engine's drafters, else its method alone). Leaves the engine empty."""
    max_rows = engine.max_rows
    context = max(1, min(CALIBRATION_CONTEXT, engine.max_input_len, engine.max_seq - max_rows - 2))
    counts = row_counts(max_rows, engine.max_batch_size)
    with one_at_a_time():
        _prefill(engine, min(engine.max_batch_size, max(shape(n, max_rows)[0] for n in counts)), context)
        verify = measure({n: _pass(engine, *shape(n, max_rows), context) for n in counts}, repeats)
        engine.reset()
        draft = {name: _draft_step(engine, name, context, draft_steps) for name in drafters}
        by_batch = {name: {b: _draft_step(engine, name, context, draft_steps, b)
                           for b in batch_sizes(engine.max_batch_size)} for name in drafters}
        catch_up = {name: _catch_up(engine, name, context, draft[name]) for name in drafters}
    return CostTable(verify, draft, "measured", {d: by for d, by in by_batch.items() if by}, catch_up)


def turn_file() -> Path:
    return Path(tempfile.gettempdir()) / f"trtspec-calibrate-{os.getuid()}.lock"


@contextlib.contextmanager
def one_at_a_time(wait_s: float = TURN_WAIT_S):
    """Calibrations on this machine take turns: an flock on a file of this user's in the temp dir. One that is
    not ours, or a turn that lasts past `wait_s`, is not waited for (the calibration measures anyway, and says
    so): a turn must never keep an engine from loading."""
    fd = None
    try:
        fd = os.open(turn_file(), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        if fcntl is None or os.fstat(fd).st_uid != os.getuid():
            raise OSError("not this user's lock file")
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise OSError(f"another calibration held its turn for over {wait_s:.0f} s") from None
                time.sleep(0.05)
    except OSError as e:
        log.warning("trtspec: calibrating without taking turns (%s): other work may skew the cost table", e)
        if fd is not None:
            os.close(fd)
            fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # closing the file releases the lock


def dummy_tokens(n: int, vocab: int) -> list[int]:
    """n ordinary token ids that repeat every 8 (so copying drafters find matches): ids from the middle of the
    vocabulary, not the special ones at its start (whose rarely trained embeddings can be tiny enough to make
    float32 arithmetic take the slow subnormal path)."""
    base = vocab // 3
    return [base + 7 * (i % 8) for i in range(n)]


def _prefill(engine, batch: int, context: int) -> None:
    """Real K/V for the calibration passes to attend to: `context` dummy tokens in rows 0..batch-1."""
    import torch

    from trtspec.runtime.cache import chain_inputs

    tokens = torch.tensor([dummy_tokens(context, engine.target.cfg.vocab_size)] * batch, device=engine.device)
    inp = chain_inputs([0] * batch, context, engine.device)
    with torch.inference_mode():
        engine.target.forward(engine.cache, inp.positions, inp.start, inp.mask, tokens=tokens, logits=False)


def _pass(engine, batch: int, rows: int, context: int) -> Callable[[], None]:
    """One target pass of `engine` over [batch, rows] inputs after `context` cached slots (the slots it writes
    are past every row's length: nothing reads them)."""
    import torch

    from trtspec.runtime.cache import chain_inputs

    ids = dummy_tokens(context + rows, engine.target.cfg.vocab_size)[context:]
    tokens = torch.tensor([ids] * batch, device=engine.device)  # [batch, rows]
    inp = chain_inputs([context] * batch, rows, engine.device)

    @torch.inference_mode()
    def run() -> None:
        engine.target.forward(engine.cache, inp.positions, inp.start, inp.mask, tokens=tokens)

    return run


def _draft_step(engine, drafter: str, context: int, steps: int, batch: int = 1) -> float:
    """Seconds of one draft step of `drafter` for `batch` requests together: the least over `steps` engine steps
    at its largest K (after one untimed step) of `batch` dummy requests in rows 0.., of the step's drafting time
    per level of depth."""
    seen = _dummy_steps(engine, drafter, context, steps, batch)
    return min([s.draft_seconds / max(1, *s.depths) for s in seen[1:]] or [0.0])


def _catch_up(engine, drafter: str, context: int, draft: float) -> float:
    """Seconds per token `drafter` takes to catch up a request it has not followed: a new dummy request's first
    step (its drafter takes in the whole prompt first) less that step's draft steps, per prompt token (the least
    of two, the drafter already warm); 0 without a step where the drafter does not lag a new request (its
    proposer's `lag`: ngram, heads)."""
    firsts = [seen[0] for seen in (_dummy_steps(engine, drafter, context, 0, lagging=True) for _ in range(2)) if seen]
    return min((max(0.0, s.draft_seconds - max(1, *s.depths) * draft) for s in firsts), default=0.0) / max(
        1, context - 1)


def _dummy_steps(engine, drafter: str, context: int, steps: int, batch: int = 1, lagging: bool = False) -> list:
    """The SpecDecodingStats of 1 + `steps` engine steps of `batch` dummy requests of `drafter` at its largest K
    (prompts of `context` dummy tokens, in rows 0..); none if `lagging` and the proposer does not lag the prefilled
    request. The engine is left empty."""
    from trtspec.runtime.sampling import SamplingParams

    prompt = dummy_tokens(context, engine.target.cfg.vocab_size)
    k = engine.plans[engine.drafter_names.index(drafter) if engine.routed else 0].k_max
    params = SamplingParams(max_new_tokens=engine.max_output_len, end_id=-1, num_draft_tokens=k)
    reqs = [engine._make(prompt, params, lambda ev: None, drafter if engine.routed else None) for _ in range(batch)]
    seen: list = []  # the steps' SpecDecodingStats
    observers, engine.on_step = engine.on_step, [seen.append]
    try:
        ended = engine.prefill(reqs, 0)
        if lagging and not engine.proposer.lag(0, len(reqs[0].seq)):
            ended = reqs
        while not ended and len(seen) <= steps:
            ended = engine.step(reqs)
    finally:
        engine.on_step = observers
        for row in range(batch):
            engine.free_row(row)
        engine.reset()
    return seen
