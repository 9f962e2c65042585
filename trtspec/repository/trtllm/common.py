"""Helpers shared by the trtllm repository flavours: protobuf I/O rows, rendering, the manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from trtspec import __version__
from trtspec.artifacts import manifest as manifests
from trtspec.names import inside
from trtspec.repository import pbtxt
from trtspec.repository.trtllm.io import Row

MANIFEST = manifests.FILE_NAMES[manifests.REPOSITORY]
MANIFEST_FORMAT = 1
INPUT_KEYS = ("engines", "tokenizer_dir")  # what the repository points at: the manifest's inputs
# Where the Triton TensorRT-LLM container keeps the backend's model templates and scripts.
CONTAINER_MODELS = "/app/all_models"
CONTAINER_LAUNCH = "/app/scripts/launch_triton_server.py"


def add_rows(config: mc.ModelConfig, inputs: list[Row], outputs: list[Row], types: dict[str, str]) -> None:
    """Append inputs/outputs given as compact rows (see io.py); `types` resolves placeholders."""
    for name, type_, dims, flags in inputs:
        t = config.input.add(name=name, data_type=pbtxt.dtype(types.get(type_, type_)), dims=dims)
        if "o" in flags:
            t.optional = True
        if "r" in flags:
            t.reshape.SetInParent()  # reshape: { shape: [ ] }
        if "g" in flags:
            t.allow_ragged_batch = True
    for name, type_, dims, _ in outputs:
        config.output.add(name=name, data_type=pbtxt.dtype(types.get(type_, type_)), dims=dims)


def cpu_instances(config: mc.ModelConfig, count: int) -> None:
    config.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_CPU)


def dynamic_batching(config: mc.ModelConfig, max_batch: int | None, delay_us: int, queue: int | None) -> None:
    db = config.dynamic_batching
    db.SetInParent()
    if max_batch is not None:
        db.preferred_batch_size.append(max_batch)
        db.max_queue_delay_microseconds = delay_us
    if queue is not None:
        db.default_queue_policy.max_queue_size = queue


def render(configs: dict[str, mc.ModelConfig], extra: dict[str, str], manifest: dict[str, Any]) -> dict[str, str]:
    """{relative path: text} for a whole repository (configs, version dirs, extra files, manifest). The
    manifest (kind "repository") has no creation time: equal renders are equal bytes."""
    files: dict[str, str] = {}
    for model, cfg in configs.items():
        files[f"{model}/config.pbtxt"] = pbtxt.to_text(cfg)
        files.setdefault(f"{model}/1/.gitkeep", "")
    files.update(extra)
    inputs = {k: manifest[k] for k in INPUT_KEYS if k in manifest}
    record = manifests.new(manifests.REPOSITORY, MANIFEST_FORMAT, created=None, inputs=inputs, outputs=sorted(files),
                           versions={"trtspec": __version__},
                           **{k: v for k, v in manifest.items() if k not in INPUT_KEYS})
    files[MANIFEST] = json.dumps(record, indent=2, sort_keys=True) + "\n"
    return files


def write_files(root: Path, files: dict[str, str]) -> None:
    """Write {relative path: text} under root; every path is checked to stay inside root first."""
    paths = {rel: inside(root, Path(root) / rel) for rel in files}
    for rel, text in files.items():
        path = paths[rel]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def read_manifest(repo_dir: Path) -> dict[str, Any] | None:
    return manifests.read(Path(repo_dir) / MANIFEST, manifests.REPOSITORY)
