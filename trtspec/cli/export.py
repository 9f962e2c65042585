"""`trtspec export vllm|k8s`: the spec as a `vllm serve` command, or as Kubernetes manifests."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.artifacts import fs
from trtspec.cli.options import config_option, json_option


@click.group()
def export() -> None:
    """Run the deployment elsewhere: the equivalent vLLM command, or Kubernetes manifests for Triton."""


@export.command("vllm")
@config_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address vLLM binds (loopback by default).")
@click.option("--port", type=click.IntRange(1, 65535), help="HTTP port (default: serving.http_port).")
@json_option
def vllm(config, host, port, as_json) -> None:
    """Print the `vllm serve` command equivalent to the spec (`--speculative-config` JSON in today's
    syntax); a method vLLM has no equivalent for is refused, saying why. The API key comes from
    $VLLM_API_KEY.

    \b
    Example:
      trtspec export vllm -c examples/demo/draft-model.toml
    """
    from trtspec.check import load_spec
    from trtspec.export import vllm as vl

    out = vl.export(load_spec(config), host, port)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    if out["note"]:
        click.echo(f"# note: {out['note']}", err=True)
    click.echo(out["command"])


@export.command("k8s")
@config_option
@click.option("--image", help="Serving image (default: runtime.trtllm.image for the TensorRT-LLM runtimes, "
              "trtspec-<name>:latest for torch).")
@click.option("--namespace", default="default", show_default=True)
@click.option("--replicas", default=1, show_default=True, type=click.IntRange(min=1), help="Minimum replicas.")
@click.option("--max-replicas", default=3, show_default=True, type=click.IntRange(min=1), help="HPA maximum.")
@click.option("--queue-target-us", default=50_000, show_default=True, type=click.IntRange(min=1),
              help="HPA target: average queue time per request per pod, microseconds.")
@click.option("--shm", default="2Gi", show_default=True, help="Size of the in-memory /dev/shm volume.")
@click.option("--startup-budget", "startup_budget", type=click.IntRange(min=10),
              help="Seconds a pod may take to load (default: 1800 on GPUs, 600 on CPU).")
@click.option("--no-secret", is_flag=True, help="Leave the Secret out (create trtspec-<name>-admin-key yourself).")
@click.option("--adapter-rule", is_flag=True, help="Print the prometheus-adapter rule for the HPA's metric instead.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write the YAML here (mode 0600).")
def k8s(config, image, namespace, replicas, max_replicas, queue_target_us, shm, startup_budget, no_secret,
        adapter_rule, output) -> None:
    """Kubernetes manifests for the Triton deployment: Secret (admin key), Deployment (GPU limits, in-memory
    /dev/shm, repository and engines mounted, startup/liveness/readiness probes), Service
    (HTTP/gRPC/metrics), ServiceMonitor, HPA on queue time.

    \b
    Example:
      trtspec export k8s -c trtspec.toml -o deploy.yaml && kubectl apply -f deploy.yaml
    """
    import yaml

    from trtspec.check import load_spec
    from trtspec.export import k8s as kube

    if adapter_rule:
        click.echo(yaml.safe_dump({"rules": {"custom": [kube.ADAPTER_RULE]}}, sort_keys=False), nl=False)
        return
    spec = load_spec(config)
    text = kube.render(kube.manifests(spec, image=image, namespace=namespace, replicas=replicas,
                                      max_replicas=max_replicas, queue_target_us=queue_target_us, shm=shm,
                                      startup_budget_s=startup_budget, secret=not no_secret))
    if not output:
        click.echo(text, nl=False)
        return
    path = Path(output)
    fs.write_bytes(path, text.encode(), 0o600)  # it holds the admin key
    click.echo(f"wrote {path}", err=True)


def register(main: click.Group) -> None:
    main.add_command(export)
