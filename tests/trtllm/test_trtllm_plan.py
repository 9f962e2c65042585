"""The trtllm-build plan: the exact flags per method, checked against the documented flag set."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tests.support import DEMO
from tests.trtllm.conftest import FAKE
from trtspec.backends.trtllm_engine_methods import engine_method
from trtspec.builders.trtllm import plan as trtllm_plan
from trtspec.cli import main
from trtspec.errors import BuildError

COMMON = ["--gemm_plugin", "float16", "--max_batch_size", "4", "--max_input_len", "512", "--max_seq_len", "768",
          "--workers", "1"]

# Expected trtllm-build flags per method and engine (after --checkpoint_dir/--output_dir).
EXPECTED = {
    ("draft-model", "target"): COMMON + ["--use_paged_context_fmha", "enable", "--speculative_decoding_mode",
                                         "draft_tokens_external", "--max_draft_len", "4"],
    ("draft-model", "draft"): COMMON + ["--use_paged_context_fmha", "enable"],
    ("medusa", "target"): COMMON + ["--speculative_decoding_mode", "medusa"],
    ("eagle", "target"): COMMON + ["--use_paged_context_fmha", "enable", "--speculative_decoding_mode", "eagle"],
    # (W, N, G) = (4, 3, 4): (N - 2) + (W - 1 + G) (N - 1) = 1 + 7 * 2 = 15
    ("lookahead", "target"): COMMON + ["--speculative_decoding_mode", "lookahead_decoding", "--max_draft_len", "15"],
    ("none", "target"): COMMON,
}


def make_plan(spec, **kw):
    """The plan for the spec and its method's row, as the trtllm-engine backend composes them."""
    return trtllm_plan.make_plan(spec, engine_method(spec), **kw)


def _flags_after_paths(step) -> list[str]:
    f = list(step.flags)
    assert f[0] == "--checkpoint_dir" and f[2] == "--output_dir"
    return f[4:]


@pytest.mark.parametrize("method", ["draft-model", "medusa", "eagle", "lookahead", "none"])
def test_dry_run_plan_flags_per_method(make_spec, workdir, method):
    spec = make_spec(method)
    plan = make_plan(spec, engines_root=workdir / "engines")
    roles = [s.role for s in plan.steps]
    assert roles == (["target", "draft"] if method == "draft-model" else ["target"])
    for step in plan.steps:
        assert _flags_after_paths(step) == EXPECTED[(method, step.role)]
        assert step.checkpoint_dir == str((workdir / "engines" / method / "checkpoints" / step.role).resolve())
        assert step.output_dir == str((workdir / "engines" / method / step.role).resolve())
        assert step.argv[0] == str(FAKE) and list(step.argv[1:]) == list(step.flags)
        d = step.to_dict()
        assert set(d) >= {"role", "argv", "shell"} and json.dumps(d)


@pytest.mark.parametrize("method", ["draft-model", "medusa", "eagle", "lookahead"])
def test_every_planned_flag_is_in_the_documented_set(make_spec, workdir, method):
    """The stand-in's parser holds exactly the documented flags; --help-free check via argparse."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("fake_trtllm_build", str(FAKE))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    for step in make_plan(make_spec(method), engines_root=workdir / "engines").steps:
        mod.parser().parse_args(list(step.flags))  # SystemExit on any unknown flag or bad value


def test_draft_logits_and_parallelism_and_dtype(make_spec, workdir):
    spec = make_spec("draft-model", dtype="bfloat16", trtllm="use_draft_logits = true\n",
                     gpu='type = "h200"\ncount = 4\ntensor_parallel = 2\npipeline_parallel = 2')
    plan = make_plan(spec, engines_root=workdir / "engines")
    target, draft = plan.step("target").flags, plan.step("draft").flags
    assert "--gather_generation_logits" in draft and "--gather_generation_logits" not in target
    assert target[target.index("--gemm_plugin") + 1] == "bfloat16"
    assert target[target.index("--workers") + 1] == "4"   # TP x PP ranks
    assert draft[draft.index("--workers") + 1] == "2"     # the draft: same TP, no PP
    assert plan.gpu_arch == "sm90" and plan.gpu_type == "h200"


def test_eagle_batch_limit_and_extra_args(make_spec, workdir):
    with pytest.raises(BuildError, match="max_batch_size <= 512"):
        make_plan(make_spec("eagle", limits="max_batch_size = 1024"), engines_root=workdir / "engines")
    spec = make_spec("medusa", trtllm='extra_build_args = ["--tokens_per_block", "64"]\n')
    flags = make_plan(spec, engines_root=workdir / "engines").steps[0].flags
    assert list(flags[-2:]) == ["--tokens_per_block", "64"]
    with pytest.raises(BuildError, match="--max_draft_len"):
        make_plan(make_spec("medusa", trtllm='extra_build_args = ["--max_draft_len=9"]\n'),
                  engines_root=workdir / "engines")


def test_docker_wrapper(make_spec, workdir):
    spec = make_spec("lookahead")
    plan = make_plan(spec, engines_root=workdir / "engines", trtllm_build="docker")
    argv = list(plan.steps[0].argv)
    assert argv[:6] == ["docker", "run", "--rm", "--gpus", "all", "--ipc"]
    image_at = argv.index(spec.runtime.trtllm.image)
    assert argv[image_at + 1] == "trtllm-build" and argv[image_at + 2:] == list(plan.steps[0].flags)
    mounts = [argv[i + 1] for i, a in enumerate(argv[:image_at]) if a == "-v"]
    root = str((workdir / "engines" / "lookahead").resolve())
    assert f"{root}:{root}" in mounts


def test_custom_command_prefix(make_spec, workdir):
    plan = make_plan(make_spec("none"), engines_root=workdir / "engines",
                     trtllm_build=f"{sys.executable} -X utf8 /opt/trtllm-build")
    assert list(plan.steps[0].argv[:3]) == [sys.executable, "-X", "utf8"]


@pytest.mark.parametrize("method", ["draft-model", "medusa", "eagle", "lookahead"])
def test_cli_dry_run_on_the_demo_specs(method):
    """What README shows: `trtspec build -c examples/demo/<m>.toml --runtime trtllm-engine --dry-run`."""
    res = CliRunner().invoke(main, ["build", "-c", str(DEMO / f"{method}.toml"), "--runtime", "trtllm-engine",
                                    "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["dry_run"] and data["runtime"] == "trtllm-engine" and data["rebuilt"] == []
    by_role = {s["role"]: s for s in data["plan"]}
    for role, step in by_role.items():
        flags = step["argv"][step["argv"].index("--checkpoint_dir"):]
        assert flags[4:] == EXPECTED[(method, role)]  # the demo's runtime.trtllm.dtype: float16
        assert step["shell"].startswith("trtllm-build --checkpoint_dir ")
    text = CliRunner().invoke(main, ["build", "-c", str(DEMO / f"{method}.toml"), "--runtime", "trtllm-engine",
                                     "--dry-run"])
    assert text.exit_code == 0 and "# target" in text.output and "trtllm-build --checkpoint_dir" in text.output


def test_stand_in_rejects_unknown_and_contradictory_flags(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "architecture": "LlamaForCausalLM", "dtype": "float16", "vocab_size": 8, "hidden_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 1, "hidden_act": "silu",
        "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}}))
    (ckpt / "rank0.safetensors").write_bytes(b"x")

    def run(*flags):
        return subprocess.run([sys.executable, str(FAKE), "--checkpoint_dir", str(ckpt), "--output_dir",
                               str(tmp_path / "out"), *flags], capture_output=True, text=True)
    assert run().returncode == 0
    assert (tmp_path / "out" / "rank0.engine").read_text().startswith("FAKE TensorRT-LLM ENGINE")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["trtspec_fake_engine"] is True
    bad = {
        ("--no_such_flag",): "unrecognized arguments",
        ("--speculative_decoding_mode", "draft_tokens_external"): "requires --max_draft_len",
        ("--speculative_decoding_mode", "lookahead_decoding"): "requires --max_draft_len",
        ("--speculative_decoding_mode", "medusa"): "MedusaForCausalLM",
        ("--max_draft_len", "4"): "no --speculative_decoding_mode",
        ("--speculative_decoding_mode", "draft_tokens_external", "--max_draft_len", "4",
         "--gather_context_logits"): "Gather context logits",
        ("--gemm_plugin", "float16", "--gemm_plugin", "float32"): "given twice",
        ("--paged_kv_cache", "enable", "--kv_cache_type", "paged"): "contradicts",
        ("--max_input_len", "100", "--max_seq_len", "50"): "max_seq_len",
        ("--use_paged_context_fmha", "maybe"): "invalid choice",
    }
    for flags, message in bad.items():
        r = run(*flags)
        assert r.returncode != 0 and message in r.stderr, (flags, r.stderr)
