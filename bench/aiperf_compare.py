"""trtspec bench's TTFT / inter-token latency against AIPerf's, on the same server and prompts.

    python bench/aiperf_compare.py [--spec examples/demo/eagle.toml] [--aiperf /tmp/aiperf-venv/bin/aiperf]

Builds the spec's deployment in a temp dir, serves it on the bundled Triton, then, at concurrency 1 with the
same prompts and max_tokens: trtspec's grid point (gRPC streaming; the deployment's own K), then AIPerf 0.13
(`--endpoint-type template` against /v2/models/ensemble/generate_stream over HTTP; it counts tokens with the
local tokenizer), then trtspec again (load drift shows as the difference of the two trtspec runs), and an HTTP
probe: the same requests on the endpoint AIPerf drives, timed as AIPerf defines TTFT/ITL (so a gap between
AIPerf and trtspec is either the protocol — then the probe sides with AIPerf — or the tool). Prints TTFT and
ITL p50/avg of each and AIPerf's difference from the mean of the trtspec runs and from the probe. AIPerf is installed
outside the project (`python -m venv /tmp/aiperf-venv && /tmp/aiperf-venv/bin/pip install aiperf==0.13.0`).
On a small machine give the server and the clients their own cores (`--server-cpus 0 --server-threads 1`) and AIPerf
one worker and one record processor (`--aiperf-arg=--workers-max --aiperf-arg=1 --aiperf-arg=--record-processors
--aiperf-arg=1`): sharing 2 cores, AIPerf's own processes slowed what it measured by a third (README "Operate it").
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _find(data, names):
    """The first dict value under any of `names` (AIPerf's JSON export nests metrics by tag)."""
    if isinstance(data, dict):
        for k, v in data.items():
            if k in names and isinstance(v, dict):
                return v
            found = _find(v, names)
            if found is not None:
                return found
    elif isinstance(data, list):
        for v in data:
            found = _find(v, names)
            if found is not None:
                return found
    return None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", default=str(ROOT / "examples/demo/eagle.toml"))
    ap.add_argument("--aiperf", default="/tmp/aiperf-venv/bin/aiperf")
    ap.add_argument("--prompts", default="builtin:code")
    ap.add_argument("-n", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--server-cpus", default="",
                    help="pin Triton (and its model stubs) to these CPUs, e.g. 0; the clients (trtspec, the probe, "
                         "AIPerf) then run on the others, so that neither side's processes slow the other's")
    ap.add_argument("--server-threads", type=int, default=0, help="the engine's torch threads (0: the spec's)")
    ap.add_argument("--aiperf-arg", action="append", default=[],
                    help="one more argument for `aiperf profile` (repeat), e.g. "
                         "--aiperf-arg=--workers-max --aiperf-arg=1")
    args = ap.parse_args()

    from trtspec.backends import build
    from trtspec.bench import load
    from trtspec.bench.prompts import builtin
    from trtspec.builders import BuildOptions
    from trtspec.check import load_spec
    from trtspec.serve import TritonServer

    spec = load_spec(args.spec)
    if args.server_threads:
        torch_cfg = spec.runtime.torch.model_copy(update={"threads": args.server_threads})
        spec = spec.model_copy(update={"runtime": spec.runtime.model_copy(update={"torch": torch_cfg})})
    every = os.sched_getaffinity(0)
    server_cpus = {int(c) for c in args.server_cpus.split(",") if c.strip()} or every
    client_cpus = (every - server_cpus) or every
    prompts = (builtin(args.prompts.split(":", 1)[1]) if args.prompts.startswith("builtin:")
               else [json.loads(x)["prompt"] for x in Path(args.prompts).read_text().splitlines() if x.strip()])
    prompts = (prompts * 4)[:args.n]
    tmp = Path(tempfile.mkdtemp(prefix="aiperf-compare-"))
    build(spec, BuildOptions(out_engines=tmp / "engines", out_repo=tmp / "model_repository", progress=False))
    server = TritonServer(tmp / "model_repository" / spec.name, ready_timeout=300)
    os.sched_setaffinity(0, server_cpus)  # the server's processes inherit it ...
    server.start()
    os.sched_setaffinity(0, client_cpus)  # ... and every client started from here on, this one
    try:
        def trtspec_run():
            g = load.measure(spec, prompts, [1], [None], max_tokens=args.max_tokens, url=server.grpc_url)
            p = g.points[0]
            return {"ttft_p50_ms": 1000 * load.percentile(p.ttfts, 50), "ttft_avg_ms": 1000 * statistics.mean(p.ttfts),
                    "itl_p50_ms": 1000 * load.percentile(p.itls, 50), "itl_avg_ms": 1000 * statistics.mean(p.itls),
                    "output_tok_s": p.tokens_per_second, "tokens": p.tokens}

        def http_run():
            """The same requests over the HTTP endpoint AIPerf drives (generate_stream, SSE), timed as AIPerf
            times them: TTFT at the first event, ITL = (last - first) / (tokens - 1), tokens counted by
            tokenizing the text; so a gap to AIPerf is either the protocol (this row) or the tool."""
            from trtspec.artifacts.tokenizer import load_tokenizer

            tok = load_tokenizer(spec.tokenizer_dir)
            host, port = server.http_url.split("//")[-1].rsplit(":", 1)
            ttfts, itls, n_tok, busy = [], [], 0, 0.0
            for prompt in prompts:
                conn = http.client.HTTPConnection(host, int(port), timeout=300)
                body = json.dumps({"text_input": prompt, "max_tokens": args.max_tokens, "stream": True})
                t0 = time.perf_counter()
                conn.request("POST", f"/v2/models/{spec.serving.ensemble_name}/generate_stream", body,
                             {"Content-Type": "application/json"})
                resp, text, first, last = conn.getresponse(), "", None, None
                for line in resp:
                    if line.startswith(b"data:"):
                        now = time.perf_counter()
                        first = first if first is not None else now
                        last = now
                        text += json.loads(line[5:]).get("text_output", "")
                conn.close()
                n = len(tok(text, add_special_tokens=False)["input_ids"])
                ttfts.append(first - t0)
                if n > 1:
                    itls.append((last - first) / (n - 1))
                n_tok, busy = n_tok + n, busy + (last - t0)
            return {"ttft_p50_ms": 1000 * load.percentile(ttfts, 50), "ttft_avg_ms": 1000 * statistics.mean(ttfts),
                    "itl_p50_ms": 1000 * load.percentile(itls, 50), "itl_avg_ms": 1000 * statistics.mean(itls),
                    "output_tok_s": n_tok / busy}

        first = trtspec_run()
        http_row = http_run()
        data = tmp / "prompts.jsonl"
        data.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
        template = tmp / "payload.jinja"  # a file: AIPerf splits an inline --extra-inputs value at its commas
        template.write_text('{"text_input": {{ text|tojson }}, "max_tokens": {{ max_tokens|tojson }}, "stream": true}')
        cmd = [args.aiperf, "profile", "-m", spec.serving.ensemble_name, "--url", server.http_url,
               "--endpoint-type", "template", "--custom-endpoint",
               f"/v2/models/{spec.serving.ensemble_name}/generate_stream", "--streaming",
               "--tokenizer", str(spec.tokenizer_dir), "--extra-inputs", f"payload_template:{template}",
               "--extra-inputs", "response_field:text_output", "--input-file", str(data),
               "--custom-dataset-type", "single_turn", "--output-tokens-mean", str(args.max_tokens),
               "--output-tokens-stddev", "0", "--concurrency", "1", "--request-count", str(len(prompts)),
               "--warmup-request-count", "1", "--artifact-dir", str(tmp / "aiperf"), *args.aiperf_arg]
        # not HF_HUB_OFFLINE: AIPerf's offline mode looks a tokenizer up in the hub cache only, never a local dir
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode:
            print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n")
            return proc.returncode
        export = next((tmp / "aiperf").rglob("profile_export_aiperf.json"))
        rep = json.loads(export.read_text())
        ttft, itl = _find(rep, {"time_to_first_token", "ttft"}), _find(rep, {"inter_token_latency", "itl"})
        thr = _find(rep, {"output_token_throughput"})
        second = trtspec_run()
        ai = {"ttft_p50_ms": ttft.get("p50"), "ttft_avg_ms": ttft.get("avg"), "itl_p50_ms": itl.get("p50"),
              "itl_avg_ms": itl.get("avg"), "output_tok_s": (thr or {}).get("avg")}
        print(f"{spec.name}: {len(prompts)} prompts x {args.max_tokens} tokens, concurrency 1; server CPUs "
              f"{sorted(server_cpus)} ({spec.runtime.torch.threads} torch threads), "
              f"clients' CPUs {sorted(client_cpus)}; "
              f"load {os.getloadavg()}")
        print(f"{'metric':<14}{'trtspec 1':>11}{'AIPerf':>11}{'trtspec 2':>11}{'AIPerf vs mean':>16}"
              f"{'HTTP probe':>12}{'AIPerf vs HTTP':>16}")
        for key in ("ttft_p50_ms", "ttft_avg_ms", "itl_p50_ms", "itl_avg_ms", "output_tok_s"):
            mean = (first[key] + second[key]) / 2
            diff = f"{100 * (ai[key] - mean) / mean:+.1f} %" if ai[key] is not None else "-"
            vs_http = f"{100 * (ai[key] - http_row[key]) / http_row[key]:+.1f} %" if ai[key] is not None else "-"
            shown = "-" if ai[key] is None else f"{ai[key]:.2f}"
            print(f"{key:<14}{first[key]:>11.2f}{shown:>11}{second[key]:>11.2f}{diff:>16}{http_row[key]:>12.2f}"
                  f"{vs_http:>16}")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
