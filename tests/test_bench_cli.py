"""`trtspec bench`: the side-by-side comparison (behaviour only; timings are never asserted)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.support import DEMO, needs_demo_models
from trtspec.cli import main


@needs_demo_models
def test_bench_local_json_and_plot(tmp_path):
    plot = tmp_path / "bench.png"
    result = CliRunner().invoke(main, ["bench", "--local", "-c", str(DEMO / "draft-model.toml"), "-n", "2",
                                       "--max-tokens", "16", "--json", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.output)
    assert report["method"] == "draft-model" and report["prompts"] == 2
    assert report["identical_outputs"] == 2  # greedy speculation is lossless
    assert report["plain"]["drafted"] == 0 and report["speculative"]["drafted"] > 0
    assert report["speculative"]["new_tokens"] == report["plain"]["new_tokens"] == 32
    assert report["costs"]["verify"]["1"] > 0  # the cost table the engine priced K with
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_prompts_file_formats(tmp_path):
    from trtspec.bench.compare import read_prompts

    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a"}\n{"text_input": "b"}\n')
    text = tmp_path / "p.txt"
    text.write_text("def f():\n    pass\n\n\nclass A:\n")
    assert read_prompts(jsonl) == ["a", "b"]
    assert read_prompts(text) == ["def f():\n    pass", "\nclass A:\n"]
