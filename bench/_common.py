"""What the benchmark scripts share (bench_smollm2, bench_eagle3, bench_training_free, bench_served_threads,
bench_qwen, bench_rows, bench_costs, bench_memory): the prompt-set reader, transformers' greedy generation, the
per-run accumulator their tables are made from, a spec's deployment built into a temp dir and served by the
bundled Triton, and the CPU's model and vector flags that every table prints beside its timings."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def cpu_model() -> str:
    """This CPU's model name ("?" where /proc/cpuinfo has none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "?"
    return next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), "?")


def vector_flags(prefixes: tuple[str, ...] = ("avx", "amx")) -> list[str]:
    """This CPU's flags that start with one of `prefixes`, in /proc/cpuinfo's order (runtime/dtypes.py's
    `cpu_flags`, the one reader of them)."""
    from trtspec.runtime.dtypes import cpu_flags

    return [f for f in cpu_flags().split() if f.startswith(prefixes)]


def jsonl_prompts(path: Path, n: int) -> list[str]:
    """The first n prompts of a prompt set (examples/smollm2/*.jsonl: one {"prompt": ...} per line)."""
    return [json.loads(line)["prompt"] for line in Path(path).read_text().splitlines() if line.strip()][:n]


def run_transformers(model, ids: list[int], new: int, eos: list[int], **kw) -> tuple[list[int], float]:
    """transformers' greedy `generate` (KV cache; `kw`: e.g. an assistant model) of up to `new` tokens after
    `ids`, cut after the first EOS: (the new tokens, wall seconds)."""
    import torch

    x = torch.tensor([ids])
    t = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new, do_sample=False,
                             eos_token_id=eos, pad_token_id=eos[0], **kw)[0, len(ids):].tolist()
    seconds = time.perf_counter() - t
    cut = next((i + 1 for i, tok in enumerate(out) if tok in eos), len(out))
    return out[:cut], seconds


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
