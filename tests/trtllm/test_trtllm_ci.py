"""CI templates parse; the engine-key helper and the serving bundle work on CPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import yaml

from tests.support import ROOT
from trtspec.backends import build
from trtspec.backends.bundle import bundle
from trtspec.backends.trtllm_engine_methods import engine_method
from trtspec.builders.trtllm.engine_cache import spec_engine_keys
from trtspec.cli import main
from trtspec.repository import pbtxt

CI = ROOT / "ci"


def test_github_workflow_parses_and_has_the_three_jobs():
    wf = yaml.safe_load((CI / "github-actions.yml").read_text())
    assert set(wf["jobs"]) == {"convert", "engines", "image"}
    assert wf["jobs"]["engines"]["needs"] == "convert" and "gpu" in wf["jobs"]["engines"]["runs-on"]
    assert "trtllm-python-py3" in wf["jobs"]["engines"]["container"]["image"]
    steps = json.dumps(wf["jobs"]["engines"]["steps"])
    assert "actions/cache@v4" in steps and "trtllm-engines-${{ needs.convert.outputs.engine_key }}" in steps
    assert "trtspec convert" in json.dumps(wf["jobs"]["convert"]["steps"])
    assert "upload-artifact" in steps


def test_gitlab_ci_parses_and_has_the_three_stages():
    ci = yaml.safe_load((CI / "gitlab-ci.yml").read_text())
    assert ci["stages"] == ["convert", "engines", "image"]
    assert ci["engines"]["tags"] == ["gpu"] and ci["engines"]["needs"] == ["convert"]
    assert ci["convert"]["artifacts"]["reports"]["dotenv"] == "key.env"
    assert any("ENGINE_KEY" in line for line in ci["engines"]["script"])
    # the image job: not named `image` (a reserved top-level keyword, tests/test_platform_validators.py)
    assert "image" not in ci or isinstance(ci["image"], str)
    assert ci["build-image"]["stage"] == "image" and ci["build-image"]["needs"] == ["convert", "engines"]
    assert any(line.startswith("docker build -f ci/Dockerfile") for line in ci["build-image"]["script"])


def test_dockerfile_and_smoke_script():
    docker = (CI / "Dockerfile").read_text()
    assert "FROM ${TRITON_IMAGE}" in docker and "bundle.json" in docker and "launch.sh" in docker
    assert "-e TRTSPEC_BIND_HOST=0.0.0.0 -e TRTSPEC_ADMIN_KEY " in docker  # passed through, never a literal
    for path in CI.iterdir():  # no template sets a literal key
        assert not re.search(r"(TRTSPEC_ADMIN_KEY|trtspec-admin-key)[=:] *[\"']?\w{8}", path.read_text()), path
    assert subprocess.run(["bash", "-n", str(CI / "gpu-smoke.sh")]).returncode == 0
    smoke = (CI / "gpu-smoke.sh").read_text()
    assert "generate -c \"$spec\" --local --no-spec --json" in smoke and "ModelRunnerCpp" in smoke


def test_engine_key_matches_the_lock(make_spec, build_opts, workdir, record):
    from click.testing import CliRunner

    spec = make_spec("draft-model")
    res = build(spec, build_opts())
    lock = json.loads((workdir / "engines" / "draft-model" / "trtspec.lock.json").read_text())
    keys = spec_engine_keys(spec, engine_method(spec), workdir / "engines")
    assert keys == {role: e["key"] for role, e in lock["engines"].items()}
    result = CliRunner().invoke(main, ["cache", "key", "-c", str(workdir / "draft-model.toml"),
                                       "--out-engines", str(workdir / "engines")])
    assert result.exit_code == 0, result.output
    out = result.output.splitlines()
    assert out[0] == "name=draft-model" and out[1].startswith("engine_key=") and len(out[1]) == 11 + 64
    assert res.rebuilt


def test_moved_workspace_rebuilds_nothing(make_spec, build_opts, workdir, record, tmp_path_factory):
    """CI jobs check out at different paths: keys depend on content, not on where it lies."""
    import shutil

    from trtspec.builders import BuildOptions
    from trtspec.check import load_spec

    build(make_spec("medusa"), build_opts())
    moved = tmp_path_factory.mktemp("elsewhere") / "ws"
    shutil.copytree(workdir, moved, symlinks=True)
    spec = load_spec(moved / "medusa.toml")
    res = build(spec, BuildOptions(out_engines=moved / "engines", out_repo=moved / "model_repository", progress=False))
    # no engine is rebuilt; the repository, whose configs hold the new absolute paths, is re-emitted and says so
    assert res.rebuilt == ["repository"] and res.skipped == ["target"]
    cfg = pbtxt.read_config(moved / "model_repository" / "medusa" / "tensorrt_llm" / "config.pbtxt")
    assert cfg.parameters["gpt_model_path"].string_value == str((moved / "engines" / "medusa" / "target").resolve())


def test_bundle_for_the_serving_image(make_spec, build_opts, workdir, record):
    spec = make_spec("draft-model")
    build(spec, build_opts())
    out = bundle(spec, workdir / "bundle", engines_root=workdir / "engines", repo_root=workdir / "model_repository")
    assert (out / "engines" / "draft-model" / "target" / "rank0.engine").is_file()
    assert not (out / "engines" / "draft-model" / "checkpoints").exists()
    assert (out / "tokenizer" / "draft-model" / "config.json").is_file()
    assert not list((out / "tokenizer" / "draft-model").glob("*.safetensors"))
    cfg = pbtxt.read_config(out / "models" / "draft-model" / "tensorrt_llm_draft" / "config.pbtxt")
    assert cfg.parameters["gpt_model_path"].string_value == "/opt/trtspec/engines/draft-model/draft"
    assert cfg.parameters["tokenizer_dir"].string_value == "/opt/trtspec/tokenizer/draft-model"
    launch = (out / "launch.sh").read_text()
    assert "exec env TRTLLM_ORCHESTRATOR=1" in launch and "--model-repository=/opt/trtspec/models/draft-model" in launch
    # bind address and admin key come from the container's environment; no literal key in the file
    assert '--http-address="${TRTSPEC_BIND_HOST:-127.0.0.1}"' in launch
    assert 'model-repository,shared-memory,trace,logging:trtspec-admin-key="${TRTSPEC_ADMIN_KEY' in launch
    assert subprocess.run(["bash", "-n", str(out / "launch.sh")]).returncode == 0
    echo = launch.replace("\nexec ", "\nexec printf '%s\\n' ")  # run it, printing the argv it would exec
    argv = subprocess.run(["bash", "-c", echo], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"},
                          check=True).stdout.splitlines()
    assert "--grpc-address=127.0.0.1" in argv
    keys = {a.rpartition("=")[2] for a in argv if "trtspec-admin-key=" in a}
    assert len(keys) == 1 and len(keys.pop()) >= 32  # unset: a random key, the API stays closed
    meta = json.loads((out / "bundle.json").read_text())
    assert meta["entry_model"] == "tensorrt_llm_bls" and "tensorrt_llm_bls" in meta["upstream_files"]["files"]
    # the Dockerfile's copy step, run against a stand-in of the container's /app/all_models
    src = workdir / "all_models" / "inflight_batcher_llm"
    for model, files in meta["upstream_files"]["files"].items():
        for f in files:
            (src / model / f).parent.mkdir(parents=True, exist_ok=True)
            (src / model / f).write_text("# stand-in\n")
    meta["upstream_files"]["source_root"] = str(src)
    meta["paths"]["repository"] = str(out / "models" / "draft-model")
    (out / "bundle.json").write_text(json.dumps(meta))
    docker = (ROOT / "ci" / "Dockerfile").read_text()
    script = docker.split("RUN python3 - <<'PY'\n", 1)[1].split("\nPY\n", 1)[0]
    script = script.replace("/opt/trtspec/bundle.json", str(out / "bundle.json"))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (out / "models" / "draft-model" / "tensorrt_llm_bls" / "1" / "lib" / "decode.py").is_file()


def test_bundle_llmapi(make_spec, build_opts, workdir):
    spec = make_spec("draft-model", name="api", kind="trtllm-llmapi")
    build(spec, build_opts())
    out = bundle(spec, workdir / "b2", engines_root=workdir / "engines", repo_root=workdir / "model_repository")
    data = yaml.safe_load((out / "models" / "api" / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert data["model"] == "/opt/trtspec/checkpoints/api/target"
    assert data["speculative_config"]["speculative_model_dir"] == "/opt/trtspec/checkpoints/api/speculative"
    assert (out / "checkpoints" / "api" / "speculative" / "model.safetensors").is_file()
