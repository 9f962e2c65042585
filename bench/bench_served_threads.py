"""Served against in-process decoding on SmolLM2 by torch intra-op threads, side by side in one run.

    .venv/bin/python bench/bench_served_threads.py [--spec examples/smollm2/ngram-int8.toml] [--threads 2,1]

For each thread count: the spec's target decoding plainly in this process (SpecEngine.generate), then the same
deployment built and served by the bundled Triton (gRPC stream, trtspec.client.generate_remote), on the same chat
prompts (examples/smollm2/chat.jsonl, greedy). Prints tokens/s of each and served / in-process. Needs `make
smollm2`. It showed where the served int8 target's gap comes from: with as many torch threads as cores, the serving
pipeline's own work (postprocessing per response, Triton's threads) stalls one of them (README "Measured here").
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import jsonl_prompts as prompts, served_deployment  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default=str(ROOT / "examples/smollm2/ngram-int8.toml"))
    ap.add_argument("--threads", default="2,1", help="torch intra-op thread counts to compare")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new", type=int, default=128, help="most new tokens per request")
    args = ap.parse_args()

    import torch

    from trtspec import methods
    from trtspec.artifacts.tokenizer import chat_prompt_ids
    from trtspec.check import load_spec
    from trtspec.client import generate_remote
    from trtspec.runtime import SamplingParams

    base = load_spec(args.spec)
    texts = prompts(ROOT / "examples/smollm2/chat.jsonl", args.prompts)
    chats = [[{"role": "user", "content": p}] for p in texts]
    before, rows = os.getloadavg(), []
    for threads in (int(t) for t in args.threads.split(",")):
        tc = base.runtime.torch.model_copy(update={"threads": threads})
        spec = base.model_copy(update={"runtime": base.runtime.model_copy(update={"torch": tc})})
        engine = methods.engine(spec)
        ids = [chat_prompt_ids(engine.tokenizer, p) for p in texts]
        engine.generate(ids[0], SamplingParams(max_new_tokens=8, num_draft_tokens=0))  # warm-up
        tokens, seconds = 0, 0.0
        for prompt in ids:
            t0 = time.perf_counter()
            tokens += len(engine.generate(prompt, SamplingParams(max_new_tokens=args.new, num_draft_tokens=0)).tokens)
            seconds += time.perf_counter() - t0
        local = tokens / seconds
        engine.close()
        torch.set_num_threads(os.cpu_count() or 1)
        with served_deployment(spec, "bench-threads-") as server:
            generate_remote(server.grpc_url, "", messages=chats[0], max_tokens=8, timeout=120)  # warm-up
            tokens, seconds = 0, 0.0
            for chat in chats:
                r = generate_remote(server.grpc_url, "", messages=chat, max_tokens=args.new, num_draft_tokens=0,
                                    timeout=300)
                tokens, seconds = tokens + r.new_tokens, seconds + r.seconds
        rows.append((threads, local, tokens / seconds))
    print(f"{base.name}: plain decoding, {len(chats)} chat prompts x <= {args.new} tokens, greedy; load "
          f"{before[0]:.2f} -> {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print(f"{'threads':>8}{'in-process tok/s':>18}{'served tok/s':>14}{'served / in-process':>21}")
    for threads, local, served in rows:
        print(f"{threads:>8}{local:>18.1f}{served:>14.1f}{served / local:>21.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
