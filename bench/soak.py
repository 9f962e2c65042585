"""Soak: N concurrent streaming gRPC clients against one served deployment for a bounded time.

    .venv/bin/python bench/soak.py [--spec examples/demo/draft-model.toml] [--clients 16] [--duration 120]
                                   [--max-tokens 64] [--interval 2] [--json out.json]
    make soak SOAK_ARGS="--clients 32 --duration 600"

Builds the spec's deployment into a temp dir, computes the greedy reference output of every prompt of a fixed
set in-process once (SpecEngine, plain decoding, the served weights), serves the deployment with the bundled
Triton server (loopback, free ports) and runs the clients: each streams greedy requests over gRPC
(`trtspec.client.generate_remote`, speculation on) one after another, cycling through the prompts, until the
time is up (a request in flight then finishes). Every output is compared with its reference. It prints the
requests served, errors, mismatches, TTFT and total latency p50/p90/p99, and the server's resident memory
(tritonserver + its Python-backend stub processes, from /proc) sampled over the run, and exits 1 if any request
failed or differed. A lighter run is an e2e test (tests/e2e/test_soak.py); the timings here are never asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from trtspec.check import load_spec  # noqa: E402
from trtspec.spec import Spec  # noqa: E402

PROMPTS = ["def parse_args(argv):\n    ", "import os\nimport sys\n\n\ndef main():\n", "class Cache:\n    ",
           "for i in range(", "    def __repr__(self):\n        return ", "try:\n    import json\nexcept",
           "def fibonacci(n):\n    ", "with open(path) as f:\n    "]


@dataclasses.dataclass
class SoakResult:
    name: str
    method: str
    clients: int
    duration_s: float                  # the clients' time budget
    seconds: float                     # first request sent -> last one done
    max_tokens: int
    requests: int = 0                  # served and compared
    errors: int = 0
    mismatches: int = 0
    tokens: int = 0
    ttft_s: list[float] = dataclasses.field(default_factory=list)
    latency_s: list[float] = dataclasses.field(default_factory=list)
    rss: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)  # (t s, MB, processes)
    examples: list[str] = dataclasses.field(default_factory=list)  # the first errors / mismatches
    server_exit: int | None = None

    @property
    def ok(self) -> bool:
        return self.requests > 0 and self.errors == 0 and self.mismatches == 0

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["ttft_ms"] = percentiles([1000 * t for t in self.ttft_s])
        d["latency_ms"] = percentiles([1000 * t for t in self.latency_s])
        del d["ttft_s"], d["latency_s"]
        return d


def percentiles(values: list[float], qs: tuple[int, ...] = (50, 90, 99)) -> dict[str, float | None]:
    import numpy as np

    return {f"p{q}": (float(np.percentile(values, q)) if values else None) for q in qs} | {
        "max": max(values) if values else None}


def server_rss(server) -> tuple[float, int]:
    """(MB resident, processes) of the server and its stub processes, from /proc/<pid>/status."""
    from trtspec.serve.processes import find_stubs

    total, count = 0, 0
    for pid in [server.pid, *find_stubs(server.shm_prefix)]:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except (OSError, TypeError):
            continue
        kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
        total, count = total + kb, count + 1
    return total / 1024, count


def references(spec: Spec, engine_dir: Path, prompts: list[str], max_tokens: int) -> list[str]:
    """Greedy plain-decoding texts of `prompts` in-process, on the weights the server loads."""
    from trtspec import methods
    from trtspec.repository.serving import load_engine_spec
    from trtspec.runtime import SamplingParams

    engine = methods.engine(load_engine_spec(engine_dir))
    try:
        params = SamplingParams(max_new_tokens=max_tokens, num_draft_tokens=0)
        return [engine.generate(p, params).text for p in prompts]
    finally:
        engine.close()


def run_soak(spec: Spec, *, clients: int = 16, duration: float = 120.0, max_tokens: int = 64,
             prompts: list[str] | None = None, interval: float = 2.0, out: Path | None = None,
             log=print) -> SoakResult:
    """Build, serve and soak `spec`'s deployment (see the module docstring); the server is always stopped."""
    from trtspec.backends import build
    from trtspec.builders import BuildOptions
    from trtspec.client import generate_remote
    from trtspec.serve import TritonServer

    prompts = list(prompts or PROMPTS)
    with tempfile.TemporaryDirectory(prefix="trtspec-soak-") as tmp:
        root = Path(out or tmp)
        built = build(spec, BuildOptions(out_engines=root / "engines", out_repo=root / "model_repository",
                                         progress=False))
        log(f"built {spec.name} ({spec.method}) in {built.seconds:.1f}s; computing {len(prompts)} references ...")
        t0 = time.monotonic()
        expected = references(spec, Path(built.engines["target"]).parent, prompts, max_tokens)
        log(f"references in {time.monotonic() - t0:.1f}s; starting the server ...")
        result = SoakResult(spec.name, spec.method, clients, duration, 0.0, max_tokens)
        server = TritonServer(Path(built.repository), ready_timeout=300, drain_timeout=60)
        t0 = time.monotonic()
        server.start()
        lock, stop = threading.Lock(), threading.Event()
        try:
            url = server.grpc_url
            generate_remote(url, prompts[0], max_tokens=4, timeout=300)  # warm-up: not counted
            log(f"serving on {url} (ready and warm in {time.monotonic() - t0:.1f}s); {clients} clients x "
                f"{duration:g}s, {max_tokens} new tokens per request")
            start = time.monotonic()
            deadline = start + duration

            def sample() -> None:
                while True:
                    mb, procs = server_rss(server)
                    result.rss.append((time.monotonic() - start, mb, procs))
                    if stop.wait(interval):
                        return

            def client(index: int) -> None:
                i = index
                while time.monotonic() < deadline:
                    k = i % len(prompts)
                    i += 1
                    try:
                        r = generate_remote(url, prompts[k], max_tokens=max_tokens, stream=True, timeout=300)
                    except Exception as exc:  # a ClientError, or a bug in the client: both count
                        with lock:
                            result.errors += 1
                            if len(result.examples) < 5:
                                result.examples.append(f"client {index}: {type(exc).__name__}: {exc}")
                        continue
                    with lock:
                        result.requests += 1
                        result.tokens += r.new_tokens
                        result.latency_s.append(r.seconds)
                        if r.ttft_seconds is not None:
                            result.ttft_s.append(r.ttft_seconds)
                        if r.text != expected[k]:
                            result.mismatches += 1
                            if len(result.examples) < 5:
                                at = next((j for j, (a, b) in enumerate(zip(r.text, expected[k])) if a != b),
                                          min(len(r.text), len(expected[k])))
                                result.examples.append(f"prompt {k}, from character {at}: expected "
                                                       f"{expected[k][at:at + 40]!r}, got {r.text[at:at + 40]!r}")

            sampler = threading.Thread(target=sample, name="soak-rss", daemon=True)
            sampler.start()
            threads = [threading.Thread(target=client, args=(n,), name=f"soak-{n}") for n in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            result.seconds = time.monotonic() - start
            stop.set()
            sampler.join(timeout=10)
            mb, procs = server_rss(server)
            result.rss.append((result.seconds, mb, procs))
        finally:
            stop.set()
            t0 = time.monotonic()
            result.server_exit = server.stop()
            log(f"server stopped in {time.monotonic() - t0:.1f}s (exit code {result.server_exit})")
    return result


def report(r: SoakResult) -> str:
    tok_s = r.tokens / r.seconds if r.seconds else 0.0
    lines = [f"soak {r.name} ({r.method}): {r.clients} clients x {r.duration_s:g}s, {r.max_tokens} new tokens "
             f"per request, greedy, streamed over gRPC",
             f"requests {r.requests}   errors {r.errors}   mismatches {r.mismatches}   tokens {r.tokens} "
             f"({tok_s:.1f} tok/s over {r.seconds:.1f}s)   server exit code {r.server_exit}",
             f"{'':<12}{'p50':>9}{'p90':>9}{'p99':>9}{'max':>9}"]
    for label, values in (("TTFT ms", r.ttft_s), ("latency ms", r.latency_s)):
        p = percentiles([1000 * v for v in values])
        lines.append(f"{label:<12}" + "".join(f"{p[k]:>9.0f}" if p[k] is not None else f"{'-':>9}"
                                             for k in ("p50", "p90", "p99", "max")))
    if r.rss:
        step = max(1, len(r.rss) // 10)
        shown = r.rss[::step] + ([r.rss[-1]] if (len(r.rss) - 1) % step else [])
        lines.append(f"server RSS (tritonserver + stubs, {r.rss[-1][2]} processes), MB over time:")
        lines.append("  " + "  ".join(f"{t:.0f}s:{mb:.0f}" for t, mb, _ in shown))
        mbs = [mb for _, mb, _ in r.rss]
        lines.append(f"  min {min(mbs):.0f}  max {max(mbs):.0f}  first {mbs[0]:.0f}  last {mbs[-1]:.0f}  "
                     f"(last - first {mbs[-1] - mbs[0]:+.0f} MB)")
    lines += [f"  {e}" for e in r.examples]
    lines.append("OK" if r.ok and r.server_exit == 0 else "FAILED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "demo" / "draft-model.toml")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds the clients keep sending requests")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between RSS samples")
    ap.add_argument("--out", type=Path, help="build dir to keep (default: a temp dir)")
    ap.add_argument("--json", type=Path, help="also write the result as JSON")
    args = ap.parse_args(argv)
    if args.clients < 1 or args.duration <= 0 or args.max_tokens < 1:
        ap.error("--clients, --duration and --max-tokens must be positive")
    result = run_soak(load_spec(args.spec), clients=args.clients, duration=args.duration,
                      max_tokens=args.max_tokens, interval=args.interval, out=args.out)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return 0 if result.ok and result.server_exit == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
