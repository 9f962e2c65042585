"""`trtspec generate --local`: the CLI over the torch runtime (speculative == plain greedy)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.support import DEMO, needs_demo_models
from trtspec.cli import main

FIELDS = {"text", "tokens", "new_tokens", "steps", "drafted", "accepted", "acceptance_rate", "tokens_per_step",
          "seconds"}


def _run(*args, input=None):
    return CliRunner().invoke(main, ["generate", "--local", *args], input=input)


@needs_demo_models
@pytest.mark.parametrize("method", ["draft-model", "eagle"])
def test_local_json_matches_plain_decoding(method):
    spec = str(DEMO / f"{method}.toml")
    prompt = "def read_config(path):\n    "
    spec_run = _run("-c", spec, "-p", prompt, "-n", "24", "--json")
    plain_run = _run("-c", spec, "-p", prompt, "-n", "24", "--json", "--no-spec")
    assert spec_run.exit_code == 0 and plain_run.exit_code == 0, spec_run.output + plain_run.output
    fast, plain = json.loads(spec_run.output), json.loads(plain_run.output)
    assert FIELDS <= set(fast)
    assert fast["tokens"] == plain["tokens"] and fast["text"] == plain["text"]
    assert fast["new_tokens"] == len(fast["tokens"]) == 24
    assert fast["drafted"] > 0 and plain["drafted"] == 0
    assert fast["tokens_per_step"] > plain["tokens_per_step"]


@needs_demo_models
def test_streamed_text_equals_json_text_and_reads_stdin():
    spec = str(DEMO / "draft-model.toml")
    streamed = _run("-c", spec, "-p", "-", "-n", "16", input="import os\n")
    as_json = json.loads(_run("-c", spec, "-p", "-", "-n", "16", "--json", input="import os\n").output)
    assert streamed.exit_code == 0, streamed.output
    assert "import os\n" + as_json["text"] in streamed.output
    assert "tokens/step" in streamed.output  # the stats line


@needs_demo_models
def test_empty_prompt_is_one_clear_error():
    result = _run("-c", str(DEMO / "draft-model.toml"), "-p", "   ")
    assert result.exit_code == 6
    assert "error: the prompt is empty" in result.output and "Traceback" not in result.output
