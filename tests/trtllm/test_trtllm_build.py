"""`trtspec build --runtime trtllm-engine` end to end with the trtllm-build stand-in:
runner, cache and lock, failures, engine/server compatibility, the memory plan."""

from __future__ import annotations

import json
import os
import time

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from tests.trtllm.conftest import FAKE, calls
from trtspec.backends import build
from trtspec.builders.trtllm.engine_cache import check_engine_compat
from trtspec.backends.trtllm_engine_methods import engine_method
from trtspec.builders.trtllm import memory
from trtspec.builders.trtllm.memory import GPU_MEMORY
from trtspec.cli import main
from trtspec.errors import BuildError


def memory_plan(spec, **kw):
    """The memory plan for the spec and its method's row, as the backends compose them."""
    return memory.memory_plan(spec, engine_method(spec), **kw)


def _tree(path):
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_draft_model_build_cache_and_lock(make_spec, build_opts, workdir, record):
    spec = make_spec("draft-model")
    res = build(spec, build_opts())
    assert sorted(res.rebuilt) == ["draft", "target"] and res.skipped == []
    root = workdir / "engines" / "draft-model"
    for role in ("target", "draft"):
        cfg = json.loads((root / role / "config.json").read_text())
        assert "build_config" in cfg and (root / role / "rank0.engine").is_file()
        assert (root / "checkpoints" / role / "rank0.safetensors").is_file()
        assert (root / "logs" / f"{role}.log").read_text().startswith("$ ")
    lock = json.loads((root / "trtspec.lock.json").read_text())
    assert lock["runtime"] == "trtllm-engine" and lock["trtllm"]["version"] == "1.2.1"
    assert lock["gpu"] == {"type": "h100", "arch": "sm90", "tensor_parallel": 1, "pipeline_parallel": 1}
    assert set(lock["engines"]) == {"target", "draft"}
    assert all(len(e["key"]) == 64 and e["fake_engine"] for e in lock["engines"].values())
    assert "--max_draft_len" in lock["engines"]["target"]["flags"]
    assert len(calls(record)) == 2

    # unchanged: nothing rebuilt, fast
    t0 = time.perf_counter()
    again = build(spec, build_opts())
    assert again.rebuilt == [] and sorted(again.skipped) == ["draft", "target"]
    assert time.perf_counter() - t0 < 1.0 and again.seconds < 1.0
    assert len(calls(record)) == 2

    # one changed weight byte in the draft -> only the draft is re-converted and rebuilt
    target_engine = _tree(root / "target")
    path = workdir / "draft" / "model.safetensors"
    sd = load_file(str(path))
    sd["model.norm.weight"][0] += 1
    save_file(sd, str(path))
    third = build(spec, build_opts())
    assert third.rebuilt == ["draft"] and third.skipped == ["target"]
    assert _tree(root / "target") == target_engine
    assert [c["checkpoint_dir"].endswith("draft") for c in calls(record)] == [False, True, True]

    # --force rebuilds everything
    assert sorted(build(spec, build_opts(force=True)).rebuilt) == ["draft", "target"]


def test_cli_build_says_nothing_to_rebuild(make_spec, workdir, record):
    make_spec("lookahead")
    cfg = str(workdir / "lookahead.toml")
    args = ["build", "-c", cfg, "--out-engines", str(workdir / "engines"), "--out-repo", str(workdir / "repo")]
    first = CliRunner().invoke(main, args + ["--json"])
    assert first.exit_code == 0, first.output
    assert json.loads(first.output)["rebuilt"] == ["target"]
    second = CliRunner().invoke(main, args)
    assert second.exit_code == 0 and "nothing to rebuild (lock unchanged)" in second.output


@pytest.mark.parametrize("method,gpu", [
    ("medusa", 'type = "h100"'),
    ("eagle", 'type = "h200"\ncount = 2\ntensor_parallel = 2'),
    ("lookahead", 'type = "h100"\ncount = 4\ntensor_parallel = 2\npipeline_parallel = 2'),
    ("none", 'type = "h200"'),
])
def test_every_method_builds_with_the_stand_in(make_spec, build_opts, workdir, record, method, gpu):
    spec = make_spec(method, gpu=gpu)
    res = build(spec, build_opts())
    assert res.rebuilt == ["target"]
    eng = workdir / "engines" / method / "target"
    cfg = json.loads((eng / "config.json").read_text())
    ws = spec.world_size
    assert sorted(p.name for p in eng.glob("rank*.engine")) == [f"rank{r}.engine" for r in range(ws)]
    arch = {"medusa": "MedusaForCausalLM", "eagle": "EagleForCausalLM"}.get(method, "LlamaForCausalLM")
    assert cfg["pretrained_config"]["architecture"] == arch
    assert cfg["build_config"]["speculative_decoding_mode"] == {"medusa": "medusa", "eagle": "eagle",
                                                                "lookahead": "lookahead_decoding"}.get(method, "none")
    if method == "medusa":
        assert cfg["build_config"]["max_draft_len"] == 8  # from the checkpoint: one token per tree node


def test_missing_trtllm_build(make_spec, build_opts, workdir, monkeypatch):
    spec = make_spec("none", trtllm="")
    monkeypatch.setenv("PATH", str(workdir / "empty-bin"))
    with pytest.raises(BuildError) as err:
        build(spec, build_opts(trtllm_build="trtllm-build"))
    assert "`trtllm-build` not found on PATH" in err.value.message and "docker" in err.value.hint


def test_trtllm_build_found_on_path(make_spec, build_opts, workdir, monkeypatch, record):
    bindir = workdir / "bin"
    bindir.mkdir()
    (bindir / "trtllm-build").symlink_to(FAKE)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    res = build(make_spec("none"), build_opts(trtllm_build="trtllm-build"))
    assert res.rebuilt == ["target"] and res.plan[0]["argv"][0] == "trtllm-build"


def test_failure_shows_the_log_tail_and_keeps_previous_outputs(make_spec, build_opts, workdir, record, monkeypatch):
    spec = make_spec("draft-model")
    build(spec, build_opts())
    root = workdir / "engines" / "draft-model"
    before = (_tree(root / "target"), _tree(root / "draft"), (root / "trtspec.lock.json").read_bytes(),
              _tree(workdir / "model_repository" / "draft-model"))
    monkeypatch.setenv("FAKE_TRTLLM_BUILD_FAIL", "1")
    with pytest.raises(BuildError) as err:
        build(spec, build_opts(force=True))
    assert "failed with exit code 1" in err.value.message
    assert "simulated failure" in err.value.message and "[3/4] timing kernels" in err.value.message
    assert "target.log" in err.value.hint
    after = (_tree(root / "target"), _tree(root / "draft"), (root / "trtspec.lock.json").read_bytes(),
             _tree(workdir / "model_repository" / "draft-model"))
    assert after == before
    assert not [p for p in root.iterdir() if ".staging-" in p.name]


def test_timeout(make_spec, build_opts, record, monkeypatch):
    spec = make_spec("none", trtllm="build_timeout_s = 1\n")
    monkeypatch.setenv("FAKE_TRTLLM_BUILD_SLEEP", "30")
    t0 = time.monotonic()
    with pytest.raises(BuildError, match="timed out after 1s"):
        build(spec, build_opts())
    assert time.monotonic() - t0 < 15


def test_contradictory_extra_args_are_rejected_by_the_tool(make_spec, build_opts, record):
    spec = make_spec("draft-model", trtllm='extra_build_args = ["--gather_context_logits"]\n')
    with pytest.raises(BuildError, match="Gather context logits is not support"):
        build(spec, build_opts())
    with pytest.raises(BuildError, match="unrecognized arguments: --bogus"):
        build(make_spec("none", trtllm='extra_build_args = ["--bogus"]\n'), build_opts())


def test_check_engine_compat(make_spec, build_opts, workdir, record, monkeypatch):
    spec = make_spec("draft-model")
    build(spec, build_opts())
    root = workdir / "engines" / "draft-model"
    problems = check_engine_compat(root, "1.2.1")
    assert len(problems) == 2 and all("FAKE engine" in p for p in problems)  # honest about the stand-in
    mismatch = check_engine_compat(root, "1.3.0rc2")
    assert any("built with TensorRT-LLM 1.2.1 but the server runs 1.3.0rc2" in p for p in mismatch)
    assert check_engine_compat(root / "target", "v1.2.1+cu128") == [p for p in problems if p.startswith("target")]
    (root / "draft" / "rank0.engine").unlink()
    assert any("draft: missing rank0.engine" in p for p in check_engine_compat(root, "1.2.1"))
    assert check_engine_compat(workdir / "nowhere", "1.2.1")[0].endswith("run `trtspec build`")
    monkeypatch.setenv("FAKE_TRTLLM_VERSION", "1.1.0")
    build(make_spec("none"), build_opts())
    assert any("engine config.json says TensorRT-LLM 1.1.0" in p
               for p in check_engine_compat(workdir / "engines" / "none", "1.2.1"))


def test_memory_plan_single_and_shared_gpu(make_spec):
    plan = memory_plan(make_spec("draft-model"))
    assert plan.gpu_memory_bytes == GPU_MEMORY["h100"] and plan.shared_gpu
    t, d = plan.model("target"), plan.model("draft")
    assert t.devices == d.devices == [0]
    assert t.max_tokens_in_paged_kv_cache == d.max_tokens_in_paged_kv_cache == t.kv_tokens > 0
    assert 0 < t.kv_cache_free_gpu_mem_fraction < 1 and 0 < d.kv_cache_free_gpu_mem_fraction < 1
    # 3 layers x 2 KV heads x head_dim 8 x K and V x fp16 = 192 bytes per token; the 1-layer draft 64
    assert (t.kv_bytes_per_token, d.kv_bytes_per_token) == (192, 64)
    assert t.kv_cache_free_gpu_mem_fraction > d.kv_cache_free_gpu_mem_fraction
    data = plan.to_dict()
    assert json.dumps(data) and {"models", "problems", "gpu_memory_bytes"} <= set(data)
    assert plan.lines()[0].startswith("model") and plan.table().row_count == 2

    separate = memory_plan(make_spec("draft-model", gpu='type = "h200"\ncount = 2'))
    assert not separate.shared_gpu and separate.model("draft").devices == [1]
    assert separate.model("target").kv_cache_free_gpu_mem_fraction == 0.9
    assert separate.model("target").max_tokens_in_paged_kv_cache is None
    fixed = memory_plan(make_spec("medusa", trtllm="kv_cache_free_gpu_mem_fraction = 0.5\n"))
    assert fixed.fraction("target") == 0.5 and fixed.ok


def test_memory_plan_reports_models_that_do_not_fit(make_spec, workdir):
    cfg = json.loads((workdir / "target" / "config.json").read_text())
    cfg.update(hidden_size=16384, intermediate_size=53248, num_hidden_layers=126, vocab_size=128256,
               num_attention_heads=128, num_key_value_heads=8, head_dim=128)  # a 405B-class shape
    (workdir / "target" / "config.json").write_text(json.dumps(cfg))
    plan = memory_plan(make_spec("none"))
    assert not plan.ok and "exceed" in plan.problems[0]
    eight = memory_plan(make_spec("none", dtype="float16", gpu='type = "h200"\ncount = 8\ntensor_parallel = 8'))
    assert not any("exceed" in p for p in eight.problems)


@pytest.fixture
def umask022():
    """The modes a plain mkdir/open gives under the usual umask 022 (whatever the CI user's umask is)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_changed_outputs_are_rebuilt_and_dead_staging_dirs_removed(make_spec, build_opts, workdir, record,
                                                                   umask022):
    """A flipped engine byte rebuilds that engine; a deleted config.pbtxt re-emits the repository; staging
    dirs of a killed build (dead pid) go, a live one stays; outputs are readable beyond their owner."""
    import stat
    import subprocess
    import sys

    spec = make_spec("draft-model")
    build(spec, build_opts())
    root, repo = workdir / "engines" / "draft-model", workdir / "model_repository" / "draft-model"
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dead, live = root / f".target.staging-{proc.pid}-x1", root / f".target.staging-{os.getpid()}-x2"
    for d in (dead, live):
        d.mkdir()
        (d / "rank0.engine").write_bytes(b"\0" * 64)

    engine = root / "draft" / "rank0.engine"
    engine.write_bytes(engine.read_bytes()[:-1] + b"\x7f")
    res = build(spec, build_opts())
    assert res.rebuilt == ["draft"] and "draft: engine files" in res.reason
    assert not dead.exists() and live.exists()

    (repo / "tensorrt_llm_draft" / "config.pbtxt").unlink()
    res = build(spec, build_opts())
    assert res.rebuilt == ["repository"] and "tensorrt_llm_draft/config.pbtxt missing" in res.reason
    assert (repo / "tensorrt_llm_draft" / "config.pbtxt").is_file()
    assert build(spec, build_opts()).rebuilt == []
    for p in [root / "draft", *(root / "draft").iterdir(), repo, root / "trtspec.lock.json"]:
        assert stat.S_IMODE(p.stat().st_mode) & 0o044 == 0o044, p  # group and others may read
