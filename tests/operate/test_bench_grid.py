"""trtspec bench's concurrency x K grid (in-process; served: tests/e2e/test_operate.py) and the metrics
summary of `trtspec status`. Behaviour only: timings are never asserted."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.support import DEMO, needs_demo_models
from trtspec.bench.load import Outcome, parse_ks, percentile, run_grid
from trtspec.cli import main


def test_grid_points_speedup_mismatches_and_percentiles():
    def send(prompt, k):  # K = 0: one token per step; K = 2: the same text, half the steps, quicker
        return Outcome(prompt.upper(), 9, 0.09, 0.01, 2 * 4 if k else 0, 6 if k else 0, 4 if k else 8)

    grid = run_grid(send, ["a", "b", "c"], [1, 2], [0, 2], name="n", method="m", where="test", max_tokens=9)
    assert [(p.concurrency, p.k) for p in grid.points] == [(1, 0), (1, 2), (2, 0), (2, 2)]
    p0, p2 = grid.point(2, 0), grid.point(2, 2)
    assert p0.mismatches == p2.mismatches == 0 and p0.speedup == 1.0
    assert p2.acceptance == 0.75 and p2.tokens_per_step == 2.0 and p0.tokens_per_step == 1.0
    assert p2.requests == 3 and p2.tokens == 27
    d = p2.to_dict()
    assert set(d["ttft_s"]) == {"p50", "p90", "p99"} and d["ttft_s"]["p99"] == 0.01
    assert d["itl_s"]["p50"] == pytest.approx(0.01)  # (latency - TTFT) / (tokens - 1), as AIPerf
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5 and percentile([], 90) is None
    assert parse_ks("0, 2,auto") == [0, 2, None]


def test_a_mismatch_against_k0_is_counted():
    grid = run_grid(lambda p, k: Outcome(p if not k else p + "!", 2, 1.0, 0.5, 0, 0, 1), ["a", "b"], [1], [0, 1],
                    name="n", method="m", where="test", max_tokens=2)
    assert grid.point(1, 1).mismatches == 2


def test_bad_grid_options_are_usage_errors(tmp_path):
    spec = tmp_path / "s.toml"
    spec.write_text('schema = 1\n[model]\ntarget = "t"\n[speculative]\ndraft = "d"\n')
    result = CliRunner().invoke(main, ["bench", "--local", "--concurrency", "0,2"])
    assert result.exit_code == 64 and "'0' is not a whole number >= 1" in result.output
    result = CliRunner().invoke(main, ["bench", "--local", "--num-draft-tokens", "2,x"])
    assert result.exit_code == 64 and "'x' is not a whole number >= 0 or 'auto'" in result.output
    result = CliRunner().invoke(main, ["bench", "--local", "-c", str(spec), "--prompts", "builtin:nope",
                                       "--concurrency", "1"])
    assert result.exit_code == 64 and "no built-in prompt set 'nope'" in result.output


@needs_demo_models
def test_bench_local_grid_writes_json_and_plot(tmp_path):
    out, plot = tmp_path / "grid.json", tmp_path / "grid.png"
    result = CliRunner().invoke(main, ["bench", "--local", "-c", str(DEMO / "draft-model.toml"), "--prompts",
                                       "builtin:code", "-n", "3", "--max-tokens", "12", "--concurrency", "1,2",
                                       "--num-draft-tokens", "0,3", "-o", str(out), "--plot", str(plot), "--json"])
    assert result.exit_code == 0, result.output
    (grid,) = json.loads(result.output)
    assert json.loads(out.read_text()) == [grid]
    points = {(p["concurrency"], p["num_draft_tokens"]): p for p in grid["points"]}
    assert set(points) == {(1, "0"), (1, "3"), (2, "0"), (2, "3")}
    for (c, k), p in points.items():
        assert p["requests"] == 3 and p["output_tokens"] == 36 and p["greedy_mismatches"] == 0
        if k == "0":
            assert p["drafted"] == 0 and p["speedup"] == 1.0 and p["per_position_acceptance"] is None
        else:
            assert p["drafted"] > 0 and 0 < p["acceptance_rate"] <= 1
            pos = p["per_position_acceptance"]
            assert 1 <= len(pos) <= 3 and pos == sorted(pos, reverse=True)  # prefix counts: non-increasing
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_status_metrics_summary_from_prometheus_text():
    from prometheus_client.parser import text_string_to_metric_families

    from trtspec.serve.control import spec_metrics

    text = """# TYPE spec_dec_requests_total counter
spec_dec_requests_total{model="tensorrt_llm",method="eagle"} 4
spec_dec_generated_tokens_total{model="tensorrt_llm",method="eagle"} 84
spec_dec_steps_total{model="tensorrt_llm",method="eagle"} 40
spec_dec_drafts_total{model="tensorrt_llm",method="eagle"} 40
spec_dec_draft_tokens_total{model="tensorrt_llm",method="eagle"} 160
spec_dec_accepted_tokens_total{model="tensorrt_llm",method="eagle"} 40
spec_dec_accepted_tokens_per_position_total{model="tensorrt_llm",method="eagle",position="0"} 30
spec_dec_accepted_tokens_per_position_total{model="tensorrt_llm",method="eagle",position="1"} 10
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 4
# TYPE nv_inference_queue_duration_us counter
nv_inference_queue_duration_us{model="ensemble",version="1"} 400
"""
    samples = [(s.name, dict(s.labels), float(s.value))
               for f in text_string_to_metric_families(text) for s in f.samples]
    out = spec_metrics(samples)
    gen = out["tensorrt_llm"]
    assert gen["method"] == "eagle" and gen["requests"] == 4 and gen["acceptance_rate"] == 0.25
    assert gen["tokens_per_step"] == 2.0 and gen["per_position_acceptance"] == [0.75, 0.25]
    assert out["ensemble"]["inferences"] == 4 and out["ensemble"]["avg_queue_us"] == 100.0
