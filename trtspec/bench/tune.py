"""`trtspec tune`: a small concurrency x K sweep, the best K per load band, written back into the spec as
`speculative.schedule` (which the torch runtime applies by batch size, and the LLM API gets as
`draft_len_schedule`, floored: trtspec.spec.draft_len_schedule).

A concurrency c becomes the band of batch size min(c, limits.max_batch_size) (more clients than rows queue);
several concurrencies in one band pick the K with the best geometric-mean speedup over them. Batch 1's K
stays speculative.num_draft_tokens (the schedule's key 1 is max_draft_len); bands that repeat the band
below them are left out. The spec is rewritten with tomlkit, so comments and layout stay as the user wrote
them, validated before it is written, and written atomically.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

from trtspec.artifacts import fs
from trtspec.bench.load import Grid
from trtspec.check import spec_from_dict
from trtspec.errors import SpecError
from trtspec.spec import Spec


def check_tunable(spec: Spec) -> None:
    """A SpecError, before any sweep, for a spec that cannot take a schedule (plain decoding; a routed spec, whose
    K is per drafter): the spec rules asked with the schedule tune would write at the least, {1 = K}."""
    data = spec.to_dict()
    data["speculative"]["schedule"] = {"1": spec.speculative.num_draft_tokens}
    spec_from_dict(data, source=spec.source)


def best_schedule(grid: Grid, spec: Spec) -> dict[int, int]:
    """{band key = batch size: K} from the grid's fixed-K points (see the module docstring)."""
    k_max, max_batch = spec.speculative.num_draft_tokens, spec.limits.max_batch_size
    bands: dict[int, list[int]] = {}
    for c in sorted({p.concurrency for p in grid.points}):
        bands.setdefault(min(c, max_batch), []).append(c)
    out: dict[int, int] = {1: k_max}
    for batch, concurrencies in sorted(bands.items()):
        if batch == 1:
            continue
        ks = sorted({p.k for p in grid.points if p.k is not None and p.k <= k_max})
        best, best_score = None, -1.0
        for k in ks:
            rows = [grid.point(c, k) for c in concurrencies]
            base = [grid.point(c, 0) or grid.point(c, k) for c in concurrencies]
            if any(r is None or not b.tokens_per_second for r, b in zip(rows, base)):
                continue
            score = math.exp(sum(math.log(max(r.tokens_per_second, 1e-9) / b.tokens_per_second)
                                 for r, b in zip(rows, base)) / len(rows))
            if score > best_score + 1e-9:
                best, best_score = k, score
        if best is not None:
            out[batch] = best
    compact, last = {}, None
    for batch, k in sorted(out.items()):
        if k != last:
            compact[batch] = k
        last = k
    return compact


def render_schedule(schedule: dict[int, int]) -> str:
    return "{" + ", ".join(f"{b} = {k}" for b, k in sorted(schedule.items())) + "}"


def with_schedule(path: Path, schedule: dict[int, int]) -> str:
    """The spec file's text with speculative.schedule set, comments and layout kept (tomlkit)."""
    import tomlkit

    doc = tomlkit.parse(path.read_text(encoding="utf-8"))
    section = doc.get("speculative")
    if section is None:
        section = tomlkit.table()
        doc["speculative"] = section
    table = tomlkit.inline_table()
    for batch, k in sorted(schedule.items()):
        table[str(batch)] = k
    section["schedule"] = table
    return tomlkit.dumps(doc)


def write_schedule(path: Path, schedule: dict[int, int]) -> Spec:
    """Set speculative.schedule in the spec file at `path`: validated first (a SpecError leaves the file as it
    was), then written atomically with the file's mode kept. Returns the spec as now written."""
    path = Path(path).resolve()  # a symlinked spec: its target is rewritten, the link kept
    text = with_schedule(path, schedule)
    spec = spec_from_dict(tomllib.loads(text), base=path.resolve().parent, source=path)
    if spec.speculative.schedule != schedule:  # what we meant is what the file now says
        raise SpecError(f"{path}: the written schedule reads back as {spec.speculative.schedule}, not {schedule}",
                        hint="report this: tomlkit wrote the table differently")
    mode = path.stat().st_mode & 0o7777
    fs.write_bytes(path, text.encode(), mode)
    return spec
