"""trtspec export: the vLLM command per method, and Kubernetes manifests validated against Kubernetes' own
JSON schemas (kubernetes-validate, offline)."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from tests.support import DEMO, needs_demo_models
from trtspec.check import load_spec, spec_from_dict
from trtspec.cli import main
from trtspec.errors import RepositoryError

K8S_VERSION = "1.30"


def _vllm(spec_path, *args):
    result = CliRunner().invoke(main, ["export", "vllm", "-c", str(spec_path), "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@needs_demo_models
@pytest.mark.parametrize("demo, method, model_key", [
    ("draft-model", "draft_model", "draft"), ("eagle", "eagle", "eagle"), ("ngram", "ngram", None)])
def test_vllm_speculative_config_per_method(demo, method, model_key):
    out = _vllm(DEMO / f"{demo}.toml")
    argv = out["argv"]
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == out["speculative_config"] and config["method"] == method
    assert config["num_speculative_tokens"] == 4
    if model_key:
        assert config["model"].endswith(f"examples/models/{model_key}")
    else:
        ngram = load_spec(DEMO / "ngram.toml").speculative.ngram
        assert config["prompt_lookup_max"] == ngram.max_matching and "model" not in config
        assert config["prompt_lookup_min"] == ngram.min_matching
    assert argv[:3] == ["vllm", "serve", str((DEMO.parent / "models" / "target").resolve())]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # loopback unless asked
    assert '--api-key "$VLLM_API_KEY"' in out["command"]  # the key from the environment, never a literal


@needs_demo_models
def test_vllm_refuses_a_tree_and_plain_decoding_has_no_speculative_config(tmp_path):
    result = CliRunner().invoke(main, ["export", "vllm", "-c", str(DEMO / "medusa.toml")])
    assert result.exit_code == 4
    assert "error: vLLM's medusa drafts a chain; speculative.choices is a tree of 8 nodes" in result.output
    assert "hint: remove speculative.choices" in result.output
    data = load_spec(DEMO / "draft-model.toml").to_dict()
    data["speculative"] = {"method": "none"}
    from trtspec.export.vllm import export

    out = export(spec_from_dict(data))
    assert out["speculative_config"] is None and "--speculative-config" not in out["argv"]


@needs_demo_models
def test_vllm_refuses_lookahead_decoding():
    result = CliRunner().invoke(main, ["export", "vllm", "-c", str(DEMO / "lookahead.toml")])
    assert result.exit_code == 4 and "error: vLLM has no speculative method for trtspec's 'lookahead'" in result.output


def test_vllm_gets_the_schedule_as_inclusive_batch_ranges():
    from trtspec.export.vllm import speculative_config

    spec = spec_from_dict({"schema": 1, "model": {"target": "t"}, "limits": {"max_batch_size": 16},
                           "speculative": {"draft": "d", "schedule": {"4": 2, "8": 0}}})
    assert speculative_config(spec)["num_speculative_tokens_per_batch_size"] == [[1, 3, 4], [4, 7, 2], [8, 16, 1]]


def test_vllm_refuses_a_method_it_has_none_for(monkeypatch):
    from trtspec.backends.trtllm_engine_methods import engine_method
    from trtspec.backends.trtllm_llmapi_methods import llmapi_method
    from trtspec.export import vllm

    spec = spec_from_dict({"schema": 1, "model": {"target": "t"}, "speculative": {"draft": "d"}})
    monkeypatch.setattr(type(engine_method(spec)), "speculative_decoding_mode", "something_else")
    monkeypatch.setattr(type(llmapi_method(spec)), "options", lambda self, s: {})
    with pytest.raises(RepositoryError, match="vLLM has no speculative method for trtspec's 'draft-model'"):
        vllm.speculative_config(spec)


def _validate(objects):
    """kubernetes-validate on every object with a schema; the CRD (ServiceMonitor) by its shape."""
    import kubernetes_validate

    kinds = []
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            ep = obj["spec"]["endpoints"][0]
            assert (obj["kind"] == "ServiceMonitor" and ep["port"] == "metrics"
                    and obj["spec"]["selector"]["matchLabels"])
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        kinds.append(obj["kind"])
    return kinds


def _manifests(spec_path, *args):
    result = CliRunner().invoke(main, ["export", "k8s", "-c", str(spec_path), *args])
    assert result.exit_code == 0, result.output
    return [d for d in yaml.safe_load_all(result.output) if d]


def _gpu_spec(tmp_path):
    path = tmp_path / "gpu.toml"
    path.write_text('schema = 1\n[model]\nname = "my_llm"\ntarget = "t"\ndtype = "float16"\n'
                    '[speculative]\nmethod = "lookahead"\n[runtime]\nkind = "trtllm-engine"\ndevice = "cuda"\n'
                    '[gpu]\ntype = "h100"\ncount = 2\ntensor_parallel = 2\n')
    return path


def test_k8s_manifests_validate_against_kubernetes_schemas(tmp_path):
    objects = _manifests(_gpu_spec(tmp_path), "--namespace", "llm", "--max-replicas", "4")
    assert _validate(objects) == ["Secret", "Deployment", "Service", "HorizontalPodAutoscaler"]
    secret, deployment, service, monitor, hpa = objects
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert deployment["metadata"]["name"] == "trtspec-my-llm" and deployment["metadata"]["namespace"] == "llm"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {m["mountPath"] for m in c["volumeMounts"] if m.get("readOnly")} == {
        "/opt/trtspec/model_repository", "/opt/trtspec/engines"}
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == c["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # engines take their time to load
    env = {e["name"]: e for e in c["env"]}
    # the pod's own IP, not every interface (the Service and the probes reach the pod IP)
    assert env["TRTSPEC_BIND_HOST"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["TRTSPEC_ADMIN_KEY"]["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"],
                                                                      "key": "admin-key"}
    assert len(secret["stringData"]["admin-key"]) == 64
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["spec"]["maxReplicas"] == 4
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "avg_time_queue_us"
    # a fresh key per export, never one written into trtspec
    assert _manifests(_gpu_spec(tmp_path))[0]["stringData"]["admin-key"] != secret["stringData"]["admin-key"]


@needs_demo_models
def test_k8s_torch_runtime_serves_with_trtspec_serve_and_no_secret_on_request(tmp_path):
    objects = _manifests(DEMO / "draft-model.toml", "--no-secret", "--startup-budget", "120")
    assert _validate(objects) == ["ConfigMap", "Deployment", "Service", "HorizontalPodAutoscaler"]
    config_map, deployment = objects[0], objects[1]
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    assert c["command"][:3] == ["trtspec", "serve", "--foreground"]
    # binds the pod IP the downward API puts into $TRTSPEC_BIND_HOST (Kubernetes expands $(VAR) in commands)
    assert c["command"][c["command"].index("--host") + 1] == "$(TRTSPEC_BIND_HOST)"
    assert {e["name"]: e for e in c["env"]}["TRTSPEC_BIND_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    assert c["startupProbe"]["failureThreshold"] == 12
    served = spec_from_dict(__import__("tomllib").loads(config_map["data"]["trtspec.toml"]))
    assert served.name == "demo-draft-model" and served.method == "draft-model"


def test_the_validator_catches_a_broken_manifest(tmp_path):
    """The check above can fail: a Deployment with a string replica count is refused."""
    import kubernetes_validate

    objects = _manifests(_gpu_spec(tmp_path))
    deployment = objects[1]
    deployment["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_k8s_refuses_a_bad_namespace(tmp_path):
    result = CliRunner().invoke(main, ["export", "k8s", "-c", str(_gpu_spec(tmp_path)), "--namespace", "Bad_NS"])
    assert result.exit_code == 4 and "error: namespace 'Bad_NS' is not a DNS-1123 label" in result.output


@needs_demo_models
def test_vllm_maps_suffix_decoding_with_its_keys():
    """vLLM's method "suffix" with the suffix_decoding_* keys (vllm/config/speculative.py), whatever the spec's
    TensorRT-LLM version (1.2.1 has no SA drafter; the vLLM export does not depend on it)."""
    out = _vllm(DEMO / "suffix.toml")
    config = out["speculative_config"]
    s = load_spec(DEMO / "suffix.toml").speculative
    assert config == {"method": "suffix", "num_speculative_tokens": s.num_draft_tokens,
                      "suffix_decoding_max_tree_depth": s.suffix.max_depth,
                      "suffix_decoding_max_cached_requests": 0,  # the global cache stays off, as trtspec's default
                      "suffix_decoding_max_spec_factor": s.suffix.max_spec_factor,
                      "suffix_decoding_min_token_prob": s.suffix.min_token_prob}
    assert "arctic-inference" in out["note"]


def test_vllm_refuses_a_suffix_offset_it_cannot_express():
    from trtspec.export.vllm import speculative_config

    spec = spec_from_dict({"schema": 1, "model": {"target": "t"},
                           "speculative": {"method": "suffix", "suffix": {"max_spec_offset": 2.0}}})
    with pytest.raises(RepositoryError, match="vLLM's suffix has no speculation offset"):
        speculative_config(spec)
