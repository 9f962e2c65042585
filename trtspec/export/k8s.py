"""`trtspec export k8s`: Kubernetes manifests for one deployment, shaped like Triton's own
`deploy/k8s-onprem` chart (a Deployment with GPU limits and health probes, a Service for HTTP/gRPC/metrics,
a ServiceMonitor, an HPA on queue time) plus what that chart lacks for the Python backend and TensorRT-LLM:

- `/dev/shm` as an in-memory emptyDir (the Python backend passes tensors through shared memory, more than
  Kubernetes' 64 MB default; the chart has none);
- the model repository and the engines mounted read-only from PersistentVolumeClaims;
- a startup probe on /v2/health/ready whose budget covers loading the engines (the chart: 30 x 10 s);
- the admin key from a Secret into $TRTSPEC_ADMIN_KEY (never a literal key in the pod spec); binds are
  explicit: $TRTSPEC_BIND_HOST = the pod's own IP (downward API status.podIP: the Service and the probes
  reach it, no other interface listens), model control closed without the key;
- the torch runtime runs `trtspec serve --foreground` (SIGTERM drains requests in flight: a raw SIGTERM
  to tritonserver hangs streamed ensemble requests in Triton 2.51); the TensorRT-LLM runtimes run the
  serving image's own launch.sh (ci/Dockerfile), with a preStop pause so the Service stops routing first;
- HPA `autoscaling/v2` (the chart's v2beta2 is gone since Kubernetes 1.26) on the per-pod metric
  `avg_time_queue_us`, which the chart's prometheus-adapter rule derives from nv_inference_queue_duration_us.

Validated in the tests against Kubernetes' JSON schemas by `kubernetes-validate`, strict (ServiceMonitor is a CRD:
checked there by its CRD's recorded shape; docs/validators.md).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

from trtspec import backends
from trtspec.errors import RepositoryError
from trtspec.spec import Spec

ROOT = "/opt/trtspec"
QUEUE_METRIC = "avg_time_queue_us"
ADAPTER_RULE = {  # prometheus-adapter rule (as the k8s-onprem chart's values.yaml), for the HPA's metric
    "seriesQuery": 'nv_inference_queue_duration_us{namespace!="",pod!=""}',
    "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
    "name": {"matches": "nv_inference_queue_duration_us", "as": QUEUE_METRIC},
    "metricsQuery": "avg(delta(nv_inference_queue_duration_us{<<.LabelMatchers>>}[30s])/"
                    "(1+delta(nv_inference_request_success{<<.LabelMatchers>>}[30s]))) by (<<.GroupBy>>)",
}


def k8s_name(name: str) -> str:
    """A spec name as a DNS-1123 label (Kubernetes object names): lowercase, '_' and '.' as '-', at most 63
    characters with room for the suffixes used here."""
    out = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")[:40].strip("-")
    return out or "deployment"


def check_namespace(namespace: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", namespace):
        raise RepositoryError(f"namespace {namespace!r} is not a DNS-1123 label",
                              hint="lowercase letters, digits and '-', at most 63, starting and ending alphanumeric")
    return namespace


def _startup_budget(spec: Spec) -> int:
    """Seconds a pod may take to become ready: engines and weights load before /v2/health/ready."""
    return 1800 if backends.for_spec(spec).capabilities.gpu else 600


def manifests(spec: Spec, *, image: str | None = None, namespace: str = "default", replicas: int = 1,
              max_replicas: int = 3, queue_target_us: int = 50_000, shm: str = "2Gi",
              repository_claim: str | None = None, engines_claim: str | None = None,
              startup_budget_s: int | None = None, secret: bool = True) -> list[dict[str, Any]]:
    """The objects, in apply order: Secret (a fresh random key; `secret=False`: use an existing Secret named
    <name>-admin-key), Deployment, Service, ServiceMonitor, HorizontalPodAutoscaler."""
    name, sv = spec.name, spec.serving
    app = f"trtspec-{k8s_name(name)}"
    check_namespace(namespace)
    labels = {"app.kubernetes.io/name": app, "app.kubernetes.io/managed-by": "trtspec"}
    meta = {"name": app, "namespace": namespace, "labels": labels}
    secret_name = f"{app}-admin-key"
    ports = [("http", sv.http_port or 8000), ("grpc", sv.grpc_port or 8001), ("metrics", sv.metrics_port or 8002)]
    backend = backends.for_spec(spec)
    gpu = backend.capabilities.gpu
    torch_runtime = not gpu
    image = image or (f"{app}:latest" if torch_runtime else spec.runtime.trtllm.image)
    env = [{"name": "TRTSPEC_BIND_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "TRTSPEC_ADMIN_KEY", "valueFrom": {"secretKeyRef": {"name": secret_name, "key": "admin-key"}}}]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"},
              {"name": "repository", "mountPath": f"{ROOT}/model_repository", "readOnly": True},
              {"name": "engines", "mountPath": f"{ROOT}/engines", "readOnly": True}]
    container: dict[str, Any] = {
        "name": "triton", "image": image, "imagePullPolicy": "IfNotPresent", "env": env, "volumeMounts": mounts,
        "ports": [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in ports],
        "securityContext": {"allowPrivilegeEscalation": False, "runAsNonRoot": True},
    }
    if torch_runtime:
        spec_path = f"{ROOT}/spec/trtspec.toml"
        container["command"] = ["trtspec", "serve", "--foreground", "-c", spec_path, "--host", "$(TRTSPEC_BIND_HOST)",
                                "--repo", f"{ROOT}/model_repository",
                                "--http-port", str(ports[0][1]), "--grpc-port", str(ports[1][1]),
                                "--metrics-port", str(ports[2][1])]
        container["workingDir"] = "/var/run/trtspec"  # .trtspec/ (the server's state, 0600) is written here
        mounts += [{"name": "spec", "mountPath": f"{ROOT}/spec", "readOnly": True},
                   {"name": "work", "mountPath": "/var/run/trtspec"}]
        container["resources"] = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}}
    else:  # the serving image's CMD, launch.sh (ci/Dockerfile): it reads the two variables above
        count = spec.gpu.count
        container["resources"] = {"limits": {"nvidia.com/gpu": count}, "requests": {"nvidia.com/gpu": count}}
        container["lifecycle"] = {"preStop": {"sleep": {"seconds": 10}}}
    period = 10
    budget = startup_budget_s or _startup_budget(spec)
    probe = lambda path, **kw: {"httpGet": {"path": path, "port": "http"}, **kw}  # noqa: E731
    container["startupProbe"] = probe("/v2/health/ready", periodSeconds=period,
                                      failureThreshold=max(1, -(-budget // period)), timeoutSeconds=5)
    container["livenessProbe"] = probe("/v2/health/live", periodSeconds=10, failureThreshold=3, timeoutSeconds=5)
    container["readinessProbe"] = probe("/v2/health/ready", periodSeconds=5, failureThreshold=3, timeoutSeconds=5)
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}},
        {"name": "repository", "persistentVolumeClaim": {"claimName": repository_claim or f"{app}-repository",
                                                          "readOnly": True}},
        {"name": "engines", "persistentVolumeClaim": {"claimName": engines_claim or f"{app}-engines",
                                                       "readOnly": True}},
    ]
    if torch_runtime:
        volumes += [{"name": "spec", "configMap": {"name": f"{app}-spec"}}, {"name": "work", "emptyDir": {}}]
    pod = {"metadata": {"labels": labels},
           "spec": {"containers": [container], "volumes": volumes,
                    "terminationGracePeriodSeconds": 60,
                    "securityContext": {"runAsUser": 1000, "runAsGroup": 1000, "fsGroup": 1000}}}
    if gpu:
        pod["spec"]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    objects: list[dict[str, Any]] = []
    if secret:
        objects.append({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                        "metadata": {**meta, "name": secret_name},
                        "stringData": {"admin-key": secrets.token_hex(32)}})
    if torch_runtime:
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {**meta, "name": f"{app}-spec"},
                        "data": {"trtspec.toml": spec_text(spec)}})
    objects += [
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
         "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": pod,
                  "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}}},
        {"apiVersion": "v1", "kind": "Service", "metadata": meta,
         "spec": {"type": "ClusterIP", "selector": labels,
                  "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports]}},
        {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": meta,
         "spec": {"selector": {"matchLabels": labels}, "namespaceSelector": {"matchNames": [namespace]},
                  "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}]}},
        {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": meta,
         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": app},
                  "minReplicas": replicas, "maxReplicas": max(max_replicas, replicas),
                  "metrics": [{"type": "Pods", "pods": {"metric": {"name": QUEUE_METRIC},
                                                        "target": {"type": "AverageValue",
                                                                   "averageValue": str(queue_target_us)}}}]}},
    ]
    return objects


def spec_text(spec: Spec) -> str:
    """The spec as the pod reads it: `trtspec serve` needs its name, serving section and limits; checkpoint
    paths are this machine's and unused there (the built repository and engines are mounted)."""
    import json

    def toml_value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(toml_value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
        raise TypeError(type(v))

    lines: list[str] = []

    def table(prefix: str, data: dict) -> None:
        scalars = {k: v for k, v in data.items() if v is not None and not (isinstance(v, dict) and k != "schedule")}
        if prefix:
            lines.append(f"\n[{prefix}]")
        lines.extend(f"{k} = {toml_value(v)}" for k, v in scalars.items())
        for k, v in data.items():
            if isinstance(v, dict) and k != "schedule":
                table(f"{prefix}.{k}" if prefix else k, v)

    table("", spec.to_dict())
    return "# written by trtspec export k8s\n" + "\n".join(lines).lstrip("\n") + "\n"


def render(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML with a header saying what to create first."""
    import yaml

    app = objects[-1]["metadata"]["name"]
    header = (f"# written by trtspec export k8s: {app}\n"
              f"# needs: PersistentVolumeClaims {app}-repository and {app}-engines holding the built model\n"
              f"# repository and engines as the pod sees them at {ROOT}/model_repository and {ROOT}/engines (torch:\n"
              f"# `trtspec build --out-repo {ROOT}/model_repository --out-engines {ROOT}/engines`; "
              "TensorRT-LLM: the bundle's\n"
              "# models/ and engines/); the NVIDIA device plugin (GPU runtimes); the Prometheus operator\n"
              "# (ServiceMonitor) and prometheus-adapter with the rule in `trtspec export k8s --adapter-rule`\n"
              f"# (the HPA's {QUEUE_METRIC}). The Secret holds a fresh random admin key: keep this file private\n"
              "# (mode 0600) or pass --no-secret and create the Secret from your secret store.\n")
    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value: str):  # multi-line strings (the ConfigMap's spec) as literal blocks
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)

    Dumper.add_representer(str, text)
    return header + "---\n".join(yaml.dump(o, Dumper=Dumper, sort_keys=False) for o in objects)
