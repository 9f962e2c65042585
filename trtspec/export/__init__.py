"""Exports of a spec for other serving stacks: `vllm` (the equivalent `vllm serve` command) and `k8s`
(Kubernetes manifests for the Triton deployment)."""
