"""Where a deployment's memory goes: peak and current RSS at each stage of loading it, in the torch runtime.

    .venv/bin/python bench/bench_memory.py [--served] SPEC [SPEC ...]

tracemalloc does not see torch's allocations, so every number is the process's own RSS (/proc/self/status:
VmRSS now, VmHWM its peak so far). Each scenario runs in a fresh child process, so its peak is its own:

  load    the first spec's target by hand, stage by stage, as this checkout loads it: the safetensors tensors
          (read all at once by older checkouts, one by one as they load since open_weights), the runtime Llama
          made from them (casts, tied embeddings, oneDNN prepacked copies, the plain weights released), the
          stored tensors dropped, the target's quantization (model.quantization; as it loads since
          open_weights), its KV cache at the spec's limits
  engine  methods.engine(spec) for each spec in turn, all held at once (what `trtspec bench --local` with
          several specs holds at its worst): the target, the proposer (a drafter), the KV caches
  served  (--served) the first spec built and served by the bundled Triton, one request answered: the RSS of
          the Python-backend stub that runs its `tensorrt_llm` model (the engine), read from /proc

"x weights" is RSS over the bytes of the weights in the serving dtype (model.dtype; int8 for a quantized
target's linears is not taken into account): the target's, plus the drafter's for a draft-model spec, each
tensor once (a tied head is the embedding). A script that prints a table, never a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def rss(pid: str = "self") -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process (default: this one), in bytes."""
    text = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) << 10, int(fields["VmHWM"].split()[0]) << 10


def served(config: str) -> list[tuple[str, int, int]]:
    """The `served` scenario: [(stage, rss, peak)] of the stub running the deployment's tensorrt_llm model."""
    from bench._common import served_deployment
    from trtspec.check import load_spec
    from trtspec.client import generate_remote

    with served_deployment(load_spec(config), "bench-memory-") as server:
        generate_remote(server.grpc_url, "def fibonacci(n):", max_tokens=16, timeout=300)
        repo = str(server.model_repository)
        stubs = []
        for proc in Path("/proc").iterdir():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a.decode(errors="replace").startswith(repo) and a.endswith(b"tensorrt_llm/1/model.py")
                   for a in cmd):
                stubs.append(proc.name)
        return [(f"Python-backend stub {pid} (tensorrt_llm), one request served", *rss(pid)) for pid in stubs]


def weight_bytes(spec) -> int:
    """Bytes of the target's weights (and a draft-model drafter's) in the serving dtype, each tensor once."""
    from trtspec.artifacts.weights import weight_shapes

    size = DTYPE_BYTES[spec.model.dtype]
    total = 0
    dirs = [spec.model.target] + ([spec.speculative.draft] if spec.speculative.draft else [])
    for d in dirs:
        for _file, shape in (weight_shapes(Path(d)) or {}).values():
            n = 1
            for s in shape:
                n *= s
            total += n * size
    return total


def child(mode: str, configs: list[str]) -> None:
    """One scenario; prints one JSON line per stage: [stage, rss, peak]."""
    stages: list[tuple[str, int, int]] = []

    def mark(stage: str) -> None:
        stages.append((stage, *rss()))

    import torch  # noqa: F401

    from trtspec import methods
    from trtspec.check import load_spec

    mark("import torch, trtspec")
    specs = [load_spec(c) for c in configs]
    if mode == "load":
        from trtspec.artifacts import weights as W
        from trtspec.artifacts.hf import ModelConfig
        from trtspec.runtime.llama import Llama, compute_dtype, target_weight_dtype

        spec = specs[0]
        q = spec.model.quantization
        lazy = hasattr(W, "open_weights")  # this checkout reads tensor by tensor (older ones: all at once)
        if lazy:
            weights = W.open_weights(spec.model.target)
            mark("safetensors headers (each tensor read as it loads)")
        else:
            weights = W.load_weights(spec.model.target)
            mark("safetensors read (stored dtype)")
        dev = spec.runtime.device
        kw = dict(quantization=q, release=True) if lazy else {}
        model = Llama(ModelConfig.from_dir(spec.model.target), weights, dtype=compute_dtype(spec.model.dtype, dev),
                      device=dev, weight_dtype=target_weight_dtype(spec.model.dtype, dev), **kw)
        mark(f"runtime Llama (casts, packs{', ' + q + ' as it loads' if lazy and q else ''})")
        del weights
        mark("stored tensors dropped")
        if q and not lazy:
            from trtspec.runtime.quant import quantize_llama

            quantize_llama(model, q)
            mark(f"quantized ({q})")
        lim = spec.limits
        cache = model.new_cache(lim.max_batch_size, lim.max_input_len + lim.max_output_len)
        mark(f"KV cache ({lim.max_batch_size} x {lim.max_input_len + lim.max_output_len} slots)")
        del cache
    else:
        held = []
        for spec in specs:
            held.append(methods.engine(spec))
            mark(f"engine {spec.name} (held: {len(held)})")
    for s in stages:
        print(json.dumps(s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("configs", nargs="+", help="spec files (trtspec.toml); the first one's target for `load`")
    ap.add_argument("--served", action="store_true", help="also serve the first spec and measure the stub")
    ap.add_argument("--child", choices=("load", "engine"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.configs)

    from bench._common import vector_flags
    from trtspec.check import load_spec

    specs = [load_spec(c) for c in args.configs]
    wb = weight_bytes(specs[0])
    print(f"weights of {specs[0].name} in {specs[0].model.dtype}: {wb / 1e9:.2f} GB")
    print(f"uptime: {os.popen('uptime').read().strip()}")
    flags = sorted(vector_flags())
    print(f"cpu flags: {' '.join(flags)}; threads {os.cpu_count()}")
    print("\n| scenario | stage | RSS GB | peak GB | peak x weights |\n|---|---|---|---|---|")
    for mode in ("load", "engine"):
        out = subprocess.run([sys.executable, __file__, "--child", mode, *args.configs], capture_output=True,
                             text=True)
        if out.returncode != 0:
            print(f"| {mode} | failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]} | | | |")
            continue
        for line in out.stdout.splitlines():
            if line.startswith("["):
                stage, now, peak = json.loads(line)
                print(f"| {mode} | {stage} | {now / 1e9:.2f} | {peak / 1e9:.2f} | {peak / wb:.2f} |")
    if args.served:
        for stage, now, peak in served(args.configs[0]):
            print(f"| served | {stage} | {now / 1e9:.2f} | {peak / 1e9:.2f} | {peak / wb:.2f} |")


if __name__ == "__main__":
    main()
