"""What the SmolLM2 benchmark scripts share (bench_smollm2, bench_eagle3, bench_training_free,
bench_served_threads): the prompt-set reader, the per-run accumulator their tables are made from, and a spec's
deployment built into a temp dir and served by the bundled Triton."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path


def jsonl_prompts(path: Path, n: int) -> list[str]:
    """The first n prompts of a prompt set (examples/smollm2/*.jsonl: one {"prompt": ...} per line)."""
    return [json.loads(line)["prompt"] for line in Path(path).read_text().splitlines() if line.strip()][:n]


@contextlib.contextmanager
def served_deployment(spec, prefix: str = "bench-") -> Iterator:
    """`spec` built into a temp dir and served by the bundled Triton (a started TritonServer); stopped and
    removed on exit."""
    from trtspec.backends import build
    from trtspec.builders import BuildOptions
    from trtspec.serve import TritonServer

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        result = build(spec, BuildOptions(out_engines=Path(tmp) / "engines", out_repo=Path(tmp) / "repo",
                                          progress=False))
        with TritonServer(Path(result.repository), ready_timeout=300) as server:
            yield server


@dataclasses.dataclass
class Meter:
    """One run's totals over its requests: tokens, wall seconds, and (from in-process results) verify steps,
    tokens after each request's first (the prefill's), drafted/accepted tokens, drafting seconds, the outputs."""

    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    step_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_seconds: float = 0.0
    outputs: list = dataclasses.field(default_factory=list)

    def add_tokens(self, tokens: list[int], seconds: float) -> None:
        self.tokens += len(tokens)
        self.seconds += seconds
        self.outputs.append(list(tokens))

    def add(self, r) -> None:
        """A runtime GenerationResult."""
        self.add_tokens(r.tokens, r.seconds)
        self.steps += r.steps
        self.step_tokens += len(r.tokens) - 1
        self.drafted += r.drafted
        self.accepted += r.accepted
        self.draft_seconds += r.draft_seconds

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0
