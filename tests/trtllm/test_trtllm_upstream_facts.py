"""Issue 13: what a real user's first TensorRT-LLM run needs, each finding against the version table
(trtspec/backends/trtllm_versions.py) and the documented upstream facts it cites."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from tests.support import DEMO, ROOT
from tests.trtllm import fixtures as fx
from tests.trtllm.conftest import spec_text
from trtspec.cli import main

# ------------------------------------------------------------------ finding 3: EAGLE fc has a bias upstream


def test_eagle_head_without_fc_bias_gets_a_zero_bias(models, tmp_path):
    """TensorRT-LLM's EAGLE drafter declares fc with bias=True (models/llama/model.py `fc_after_embed`) and its
    loader reads fc.bias unconditionally: a bias-less head must still give every net a drafter.fc.bias."""
    from trtspec.convert.checkpoint import ConvertJob, read_checkpoint, run_job

    head = tmp_path / "eagle"
    head.mkdir()
    sd = load_file(str(models / "eagle" / "model.safetensors"))
    sd.pop("fc.bias")
    save_file(sd, str(head / "model.safetensors"))
    cfg = json.loads((models / "eagle" / "config.json").read_text())
    (head / "config.json").write_text(json.dumps({**cfg, "bias": False}))
    out = tmp_path / "ckpt"
    run_job(ConvertJob("target", "eagle", models / "target", head, out, 2, 1, "float16", max_draft_len=4,
                       num_eagle_layers=2, max_non_leaves_per_layer=1))
    for rank in (0, 1):
        r = load_file(str(out / f"rank{rank}.safetensors"))
        for n in range(2):
            bias = r[f"eagle_nets.{n}.drafter.fc.bias"]
            assert bias.shape == (fx.HIDDEN // 2,) and bias.dtype == torch.float16 and not bias.any()
    back = read_checkpoint(out).eagle
    assert torch.equal(back["fc.weight"], sd["fc.weight"].half()) and not back["fc.bias"].any()


# ------------------------------------------------------------------ finding 1: the container for the version

NGC = re.compile(r"nvcr\.io/nvidia/tritonserver:(\d\d\.\d\d)-trtllm-python-py3")


def test_the_table_is_nvidias_compatibility_matrix():
    """Rows as server docs/introduction/compatibility.md (r26.08) lists them: 25.12 ships 1.1.0 (tensorrtllm_backend
    r25.12: TENSORRTLLM_VER=1.1.0), the first container with 1.2.1 is 26.04 (r26.04-r26.07)."""
    from trtspec.backends import trtllm_versions as v

    ships = {r.triton: r.trtllm for r in v.RELEASES}
    assert ships["25.12"] == "1.1.0" and ships["25.11"] == "1.0.3.2510" and ships["26.03"] == "1.2.0"
    assert [t for t, version in ships.items() if version == "1.2.1"] == ["26.04", "26.05", "26.06", "26.07"]
    assert v.BY_TRITON["26.07"].tensorrt == "10.14.1.48" and v.BY_TRITON["25.12"].tensorrt == "10.13.3.9"
    assert v.DEFAULT_VERSION == "1.2.1" and v.image_release(v.DEFAULT_IMAGE) in ("26.04", "26.05", "26.06", "26.07")


def test_every_default_and_template_names_a_container_of_its_version():
    """The spec's defaults, `trtspec init`'s template, ci/, the README and docs/ pair 1.2.1 with a 1.2.1 container."""
    from trtspec.backends import trtllm_versions as v
    from trtspec.spec import TrtllmRuntime

    assert (TrtllmRuntime().version, TrtllmRuntime().image) == (v.DEFAULT_VERSION, v.DEFAULT_IMAGE)
    template = tomllib.loads((ROOT / "trtspec" / "spec_template.toml").read_text())["runtime"]["trtllm"]
    assert (template["version"], template["image"]) == (v.DEFAULT_VERSION, v.DEFAULT_IMAGE)
    seen = {}
    for path in [*sorted((ROOT / "ci").iterdir()), ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for release in NGC.findall(path.read_text()):
            seen[f"{path.name}: {release}"] = v.BY_TRITON[release].trtllm
    assert len(seen) >= 5 and set(seen.values()) == {v.DEFAULT_VERSION}, seen


@pytest.mark.parametrize("kind", ["trtllm-engine", "trtllm-llmapi"])
def test_an_image_of_another_tensorrt_llm_is_refused(make_spec, kind):
    from trtspec.errors import SpecError

    with pytest.raises(SpecError, match=r"runtime.trtllm.image = .*25\.12.*ships TensorRT-LLM 1\.1\.0, not"):
        make_spec("none", kind=kind, trtllm='image = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"\n')
    with pytest.raises(SpecError, match=r"runtime.trtllm.version = '9.9.9': no Triton TensorRT-LLM container"):
        make_spec("none", kind=kind, trtllm='version = "9.9.9"\n')
    with pytest.raises(SpecError, match=r"Triton 27.01 is not in trtspec's container table"):
        make_spec("none", kind=kind, trtllm='image = "nvcr.io/nvidia/tritonserver:27.01-trtllm-python-py3"\n')


def test_an_older_pair_serves_with_the_llm_api_but_engines_are_pinned_to_1_2(make_spec):
    from trtspec.errors import SpecError

    older = 'version = "1.1.0"\nimage = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"\n'
    assert make_spec("none", kind="trtllm-llmapi", trtllm=older).runtime.trtllm.version == "1.1.0"
    with pytest.raises(SpecError, match=r"pinned to TensorRT-LLM 1\.2\.x.*fix: set version = \"1\.2\.1\""):
        make_spec("none", kind="trtllm-engine", trtllm=older)
    # a newer TensorRT-LLM in a custom image: the LLM API takes it (its spelling: the canonical one), engines not
    newer = 'version = "1.3.0rc27"\nimage = "registry.example/trtllm:1.3.0rc27"\n'
    assert make_spec("none", kind="trtllm-llmapi", trtllm=newer).runtime.trtllm.version == "1.3.0rc27"
    with pytest.raises(SpecError, match=r"no Triton TensorRT-LLM container ships TensorRT-LLM 1\.3\.0rc27"):
        make_spec("none", kind="trtllm-engine", trtllm=newer)


def test_check_build_and_serve_refuse_the_pair_and_check_notes_what_it_cannot_see(make_spec, workdir):
    make_spec("none", name="ok", trtllm='image = "registry.example/my-llm:1"\n')
    text = CliRunner().invoke(main, ["check", "-c", str(workdir / "ok.toml"), "--no-models"]).output
    assert "registry.example/my-llm:1 is not an NGC Triton TensorRT-LLM tag" in text
    assert "trtllm-engine is a legacy runtime, pinned to TensorRT-LLM 1.2.x" in text  # the post-engine world
    bad = 'image = "nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3"\n'
    (workdir / "bad.toml").write_text("schema = 1\n" + spec_text("none", name="bad", trtllm=bad))
    for argv in (["check", "--no-models"], ["build", "--dry-run"], ["serve", "--print-command"]):
        res = CliRunner().invoke(main, [argv[0], "-c", str(workdir / "bad.toml"), *argv[1:]])
        assert res.exit_code == 2 and "ships TensorRT-LLM 1.1.0" in res.output, (argv, res.output)


# ------------------------------------------------------------------ finding 2: FP16/BF16 only


@pytest.mark.parametrize("kind", ["trtllm-engine", "trtllm-llmapi"])
def test_float32_is_refused_with_the_fix(make_spec, kind):
    from trtspec.errors import SpecError

    with pytest.raises(SpecError, match=r"model.dtype = 'float32': .*FP16/BF16/FP8 only \(fix: set model.dtype = "
                                        r"\"float16\""):
        make_spec("none", kind=kind, dtype="float32")
    with pytest.raises(SpecError, match=r"runtime.trtllm.dtype = 'float32'"):
        make_spec("none", kind=kind, trtllm='dtype = "float32"\n')


def test_runtime_trtllm_dtype_is_what_tensorrt_llm_builds_and_serves(make_spec, workdir):
    """A spec keeps float32 for the torch runtime and says float16 for TensorRT-LLM (the demo specs do)."""
    from trtspec.backends.trtllm_engine_methods import engine_method
    from trtspec.backends.trtllm_llmapi_methods import llm_args
    from trtspec.builders.trtllm.plan import make_plan
    from trtspec.repository.trtllm.llmapi import model_yaml

    spec = make_spec("draft-model", dtype="float32", trtllm='dtype = "bfloat16"\n')
    flags = make_plan(spec, engine_method(spec), engines_root=workdir / "engines").steps[0].flags
    assert flags[flags.index("--gemm_plugin") + 1] == "bfloat16"
    assert {j.dtype for j in engine_method(spec).conversions(spec, workdir / "ckpt")} == {"bfloat16"}
    api = make_spec("draft-model", name="api", kind="trtllm-llmapi", dtype="float32", trtllm='dtype = "float16"\n')
    assert model_yaml(api, llm_args(api))["dtype"] == "float16"


@pytest.mark.parametrize("method", ["draft-model", "medusa", "eagle", "lookahead"])
def test_the_demo_specs_are_valid_for_both_tensorrt_llm_runtimes(method):
    from trtspec.check import load_spec
    from trtspec.cli.options import with_runtime
    from trtspec.errors import SpecError

    spec = load_spec(DEMO / f"{method}.toml")
    assert spec.model.dtype == "float32"  # the torch runtime's demo stays exact
    assert with_runtime(spec, "trtllm-engine").trtllm_dtype == "float16"
    try:
        assert with_runtime(spec, "trtllm-llmapi").trtllm_dtype == "float16"
    except SpecError as exc:  # only a method the LLM API does not serve (medusa; lookahead: see the ngram method)
        assert all(p.startswith("speculative.method") for p in exc.problems), exc.problems


# ------------------------------------------------------------------ finding 4: relocatable LLM-API repositories

WRAPPER = ROOT / "trtspec" / "repository" / "trtllm" / "llmapi_model.py"


def _wrapper(monkeypatch, path=WRAPPER, load: bool = False):
    """The repository's entry point as Triton loads it: a top-level module from its file."""
    import importlib.util

    if not load:
        monkeypatch.setenv("TRTSPEC_LLMAPI_NO_LOAD", "1")
    spec = importlib.util.spec_from_file_location("trtspec_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _eagle3(workdir):
    cfg = json.loads((workdir / "eagle" / "config.json").read_text())
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    (workdir / "eagle" / "config.json").write_text(json.dumps(cfg))


def test_llmapi_repository_holds_no_path_of_the_build_machine(make_spec, workdir, build_opts, monkeypatch):
    import shutil

    import yaml

    from trtspec.backends import build
    from trtspec.repository import pbtxt

    spec = make_spec("draft-model", name="api", kind="trtllm-llmapi")
    repo = Path(build(spec, build_opts()).repository)
    for f in repo.rglob("*"):
        if f.is_file():
            assert str(workdir) not in f.read_text(), f
    data = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert data["model"] == "../../target" and data["speculative_config"]["speculative_model_dir"] == "../../draft"
    cfg = pbtxt.read_config(repo / "tensorrt_llm" / "config.pbtxt")
    assert cfg.default_model_filename == "trtspec_model.py" and cfg.model_transaction_policy.decoupled
    assert (repo / "tensorrt_llm" / "1" / "trtspec_model.py").read_text() == WRAPPER.read_text()
    # moved (or mounted) elsewhere with its checkpoints, it resolves to where it is now
    moved = workdir / "elsewhere"
    for d in ("target", "draft"):
        shutil.copytree(workdir / d, moved / d)
    shutil.copytree(repo, moved / "model_repository" / "api")
    version = moved / "model_repository" / "api" / "tensorrt_llm" / "1"
    env = {}
    resolved = _wrapper(monkeypatch).prepare(version, env)
    out = yaml.safe_load(resolved.read_text())
    assert env["LLM_CONFIG_PATH"] == str(resolved) and resolved.stat().st_mode & 0o077 == 0
    assert out["model"] == str(moved / "target") and out["tokenizer"] == str(moved / "target")
    assert out["speculative_config"]["speculative_model_dir"] == str(moved / "draft")
    assert out["speculative_config"]["decoding_type"] == "DraftTarget" and out["triton_config"]["decoupled"]


def test_the_entry_point_honours_the_override_and_names_a_missing_checkpoint(monkeypatch, tmp_path):
    w = _wrapper(monkeypatch)
    mounted = tmp_path / "ckpt"
    for role in ("target", "speculative"):
        (mounted / role).mkdir(parents=True)
    data = {"model": "../../target", "tokenizer": "../../target",
            "speculative_config": {"decoding_type": "Eagle", "speculative_model_dir": "/build/machine/eagle"}}
    out = w.resolve(data, tmp_path / "repo", override=str(mounted))
    assert (out["model"], out["tokenizer"]) == (str(mounted / "target"), str(mounted / "target"))
    assert out["speculative_config"]["speculative_model_dir"] == str(mounted / "speculative")
    assert data["model"] == "../../target"  # the input is not changed
    with pytest.raises(RuntimeError, match=r"model.yaml speculative_config.speculative_model_dir: checkpoint dir "
                                           r"/build/machine/eagle not found"):
        w.resolve({**data, "model": str(mounted / "target"), "tokenizer": "../ckpt/target"}, tmp_path / "repo")


def test_the_entry_point_hands_over_to_the_containers_model_py(monkeypatch, tmp_path):
    """What Triton does with the repository: import trtspec_model.py, which resolves model.yaml and returns
    the container's TritonPythonModel (stand-ins here for model.py and its helpers.py)."""
    import sys

    import yaml

    version = tmp_path / "repo" / "tensorrt_llm" / "1"
    version.mkdir(parents=True)
    (tmp_path / "target").mkdir()
    (version / "model.yaml").write_text(yaml.safe_dump({"model": "../target", "triton_config": {"decoupled": 1}}))
    (version / "helpers.py").write_text("ANSWER = 42\n")
    (version / "model.py").write_text("import os\nfrom helpers import ANSWER\n\nclass TritonPythonModel:\n"
                                      "    config = os.environ['LLM_CONFIG_PATH']\n")
    entry = version / "trtspec_model.py"
    entry.write_text(WRAPPER.read_text())
    monkeypatch.delenv("TRTSPEC_LLMAPI_NO_LOAD", raising=False)
    monkeypatch.setenv("LLM_CONFIG_PATH", "model.yaml")  # restored afterwards: the entry point sets it
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "helpers", raising=False)
    model = _wrapper(monkeypatch, entry, load=True).TritonPythonModel
    assert yaml.safe_load(Path(model.config).read_text())["model"] == str(tmp_path / "target")


# ------------------------------------------------------------------ finding 5: mpirun for the LLM API


def test_llmapi_serves_under_mpirun_with_one_rank_as_upstream_launches_it(make_spec, workdir):
    from trtspec.backends import launch_command, launch_world_size

    spec = make_spec("none", name="tp2", kind="trtllm-llmapi", gpu='type = "h200"\ncount = 2\ntensor_parallel = 2')
    argv = launch_command(spec, workdir / "model_repository" / "tp2")
    assert argv[:5] == ["mpirun", "--allow-run-as-root", "-n", "1", "/opt/tritonserver/bin/tritonserver"]
    assert argv[-2:] == ["--disable-auto-complete-config", "--backend-config=python,shm-region-prefix-name=prefix0_"]
    assert argv.count("/opt/tritonserver/bin/tritonserver") == 1 and launch_world_size(spec) == 1
    res = CliRunner().invoke(main, ["serve", "-c", str(workdir / "tp2.toml"), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["argv"][:2] == ["mpirun", "--allow-run-as-root"], res.output


# ------------------------------------------------------------------ finding 6: speculative_config spelling


def test_speculative_config_is_spelled_as_tensorrt_llm_1_2_parses_it(make_spec, workdir):
    """1.1/1.2-era DecodingBaseConfig.from_dict takes DraftTarget (not Draft_Target) and Eagle (no Eagle3 key);
    `speculative_model_dir` is the field there and an alias later."""
    import yaml

    from trtspec.backends import trtllm_versions as v
    from trtspec.backends.trtllm_llmapi_methods import llm_args, speculative_config
    from trtspec.repository.trtllm.llmapi import render_llmapi_repository

    assert {v.series(version) for version in v.known_versions()} <= set(v.LLMAPI_SPELLINGS)
    dm = make_spec("draft-model", name="dm", kind="trtllm-llmapi")
    assert speculative_config(dm) == {"decoding_type": "DraftTarget", "max_draft_len": 4,
                                      "speculative_model_dir": str((workdir / "draft").resolve())}
    _eagle3(workdir)
    ea = speculative_config(make_spec("eagle", name="ea", kind="trtllm-llmapi"))
    assert (ea["decoding_type"], ea["eagle3_one_model"], ea["speculative_model_dir"]) == (
        "Eagle", True, str((workdir / "eagle").resolve()))
    for spec in (dm, make_spec("eagle", name="ea2", kind="trtllm-llmapi")):
        text = render_llmapi_repository(spec, llm_args(spec))["tensorrt_llm/1/model.yaml"]
        sc = yaml.safe_load(text)["speculative_config"]
        assert sc["decoding_type"] in ("DraftTarget", "Eagle") and "speculative_model" not in sc


# ------------------------------------------------------------------ finding 7: template drift, tracked


def test_template_drift_is_tracked_and_trtspec_renders_neither_side_of_it(make_spec):
    """Newer preprocessing templates add IMAGES / hf_model_path; enable_trt_overlap is commented out in some
    templates and not in others. trtspec renders none of them, and its manifest says why."""
    from trtspec.repository.trtllm.engine import OMITTED_PARAMETERS, TEMPLATE_DRIFT

    files = render_engine_repository_for(make_spec("lookahead"))
    pre = files["preprocessing"]
    assert "IMAGES" not in [i.name for i in pre.input] and "hf_model_path" not in pre.parameters
    assert "enable_trt_overlap" not in files["tensorrt_llm"].parameters and "enable_trt_overlap" in OMITTED_PARAMETERS
    assert set(TEMPLATE_DRIFT) == {"preprocessing IMAGES", "preprocessing hf_model_path",
                                   "tensorrt_llm enable_trt_overlap"}


def render_engine_repository_for(spec):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from trtspec.backends.trtllm_engine_methods import engine_method
    from trtspec.builders.trtllm.memory import memory_plan
    from trtspec.repository.trtllm import render_engine_repository

    method = engine_method(spec)
    files = render_engine_repository(spec, method, engine_dirs={"target": "/e/target"},
                                     memory=memory_plan(spec, method))
    manifest = json.loads(files["trtspec.repo.json"])
    assert "template_drift" in manifest
    return {m: text_format.Parse(files[f"{m}/config.pbtxt"], mc.ModelConfig())
            for m in ("preprocessing", "tensorrt_llm")}
