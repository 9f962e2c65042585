"""Writing and reading TensorRT-LLM checkpoints (`config.json` + `rank{N}.safetensors`).

Writers take HF directories and produce a checkpoint directory atomically (a failed conversion
leaves the previous one untouched). `read_checkpoint` is the exact inverse: it reassembles the
HF state dicts (target, Medusa heads, EAGLE head) from any TP/PP sharding, checking every
replicated tensor agrees across ranks.

A `trtspec.convert.json` manifest (trtspec.artifacts.manifest, kind "convert") beside the weights records
what the checkpoint was made from (inputs: source file digests; the options) and what was written (outputs);
a conversion whose manifest matches is skipped.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from trtspec.artifacts import manifest
from trtspec.artifacts.fs import atomic_dir, content_only, digest, file_digests, read_json_object
from trtspec.artifacts.hf import CONFIG, ModelConfig
from trtspec.artifacts.weights import MODEL_WEIGHTS, load_file, load_weights, save_weights, weight_files
from trtspec.convert import hf
from trtspec.convert.mapping import Mapping
from trtspec.convert.trtllm_heads import layout
from trtspec.errors import ConvertError

if TYPE_CHECKING:
    import torch

MANIFEST = manifest.FILE_NAMES[manifest.CONVERT]
MANIFEST_FORMAT = 1
LLAMA = "llama"  # a plain Llama-family checkpoint; a head method's job kind is the method's name
CONVERTER_VERSION = 1
Tensors = dict[str, "torch.Tensor"]


@dataclasses.dataclass(frozen=True)
class ConvertJob:
    """One checkpoint to write: what from, with which options, to where."""

    role: str                      # "target" | "draft"
    kind: str                      # LLAMA, or a head layout's (trtspec/convert/trtllm_heads.py: MEDUSA, EAGLE)
    model_dir: Path
    heads_dir: Path | None
    out_dir: Path
    tp: int = 1
    pp: int = 1
    dtype: str = "float16"
    max_draft_len: int = 0         # medusa / eagle
    num_eagle_layers: int = 0      # eagle
    max_non_leaves_per_layer: int = 0

    @property
    def mapping(self) -> Mapping:
        return Mapping(self.tp, self.pp)

    def options(self) -> dict[str, Any]:
        return {"kind": self.kind, "tp": self.tp, "pp": self.pp, "dtype": self.dtype,
                "max_draft_len": self.max_draft_len, "num_eagle_layers": self.num_eagle_layers,
                "max_non_leaves_per_layer": self.max_non_leaves_per_layer, "converter": CONVERTER_VERSION}

    def source_files(self) -> dict[str, list[Path]]:
        """Files conversion reads, per source dir ("model", "heads")."""
        files = {"model": [self.model_dir / CONFIG, *weight_files(self.model_dir, error=ConvertError)]}
        index = self.model_dir / f"{MODEL_WEIGHTS}.index.json"
        if index.is_file():
            files["model"].append(index)
        if self.heads_dir is not None:
            weights = layout(self.kind).weights
            files["heads"] = [self.heads_dir / CONFIG, *weight_files(self.heads_dir, weights, ConvertError)]
        return files


@dataclasses.dataclass
class ConvertedCheckpoint:
    role: str
    path: str
    architecture: str
    world_size: int
    converted: bool                # False: the manifest matched, nothing was written
    seconds: float
    fingerprint: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------------- writing


def _config_and_ranks(job: ConvertJob) -> tuple[dict[str, Any], Callable[[int, int, int], Tensors]]:
    from trtspec.convert import llama_tensors

    where = str(job.model_dir)
    shape = hf.model_config(job.model_dir)
    sd = load_weights(job.model_dir, error=ConvertError)
    dtype = hf.torch_dtype(job.dtype)
    mapping = job.mapping
    config, head = ((llama_tensors.base_config(shape, job.dtype, mapping, shape.architecture), None)
                    if job.kind == LLAMA else layout(job.kind).write(job, shape, sd, dtype))

    def ranks(rank, t, p):
        w = llama_tensors.base_rank_weights(sd, shape, mapping, t, p, dtype, where)
        if head is not None:
            w.update(head(t, p))
        return w
    return config, ranks


def fingerprint(job: ConvertJob, previous: dict[str, Any] | None = None, use_cache: bool = True
                ) -> tuple[str, dict[str, Any]]:
    """Digest of the sources' CONTENT (keys relative to each source dir, so the same checkpoint
    checked out elsewhere, e.g. in another CI job, has the same fingerprint) and the options."""
    old = ((previous or {}).get("inputs") or {}).get("files") or {}
    files: dict[str, Any] = {}
    for label, paths in job.source_files().items():
        root = job.model_dir if label == "model" else job.heads_dir
        prev = {k.split("/", 1)[1]: v for k, v in old.items() if k.startswith(label + "/")}
        for k, v in file_digests(paths, root=root, previous=prev, use_cache=use_cache).items():
            files[f"{label}/{k}"] = v
    return digest({"sources": content_only(files), "options": job.options()}), files


def is_fresh(job: ConvertJob, use_cache: bool = True) -> tuple[bool, str, dict[str, Any]]:
    """(fresh, fingerprint, source digests): does `job.out_dir` hold exactly this conversion?"""
    recorded = read_manifest(job.out_dir)
    fp, files = fingerprint(job, recorded, use_cache)
    fresh = recorded is not None and recorded.get("fingerprint") == fp and all(
        (job.out_dir / f).is_file() for f in [CONFIG, *((recorded.get("outputs") or {}).get("files") or [])])
    return fresh, fp, files


def read_manifest(ckpt_dir: Path) -> dict[str, Any] | None:
    """The conversion manifest (None: none, unreadable, or from before the manifest shape: reconverted)."""
    data = manifest.read(Path(ckpt_dir) / MANIFEST, manifest.CONVERT)
    return data if data is not None and data.get("kind") == manifest.CONVERT else None


def run_job(job: ConvertJob, force: bool = False, log: Callable[[str], None] | None = None) -> ConvertedCheckpoint:
    """Convert unless the checkpoint on disk was made from the same sources with the same options."""
    t0 = time.perf_counter()
    for d in (job.model_dir, job.heads_dir):
        if d is not None and not Path(d).is_dir():
            raise ConvertError(f"checkpoint dir not found: {d}", hint="check the paths in the spec")
    fresh, fp, files = is_fresh(job, use_cache=not force)
    if fresh and not force:
        cfg = read_json_object(job.out_dir / CONFIG, "checkpoint", ConvertError)
        return ConvertedCheckpoint(job.role, str(job.out_dir), cfg["architecture"], job.mapping.world_size, False,
                                   time.perf_counter() - t0, fp)
    if log:
        log(f"converting {job.role} ({job.kind}, tp={job.tp}, pp={job.pp}, {job.dtype}) -> {job.out_dir}")
    config, ranks = _config_and_ranks(job)
    written = []
    with atomic_dir(job.out_dir) as tmp:
        (tmp / CONFIG).write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
        for rank, t, p in job.mapping.ranks():
            name = f"rank{rank}.safetensors"
            save_weights(ranks(rank, t, p), tmp / name)
            written.append(name)
        manifest.write(tmp / MANIFEST, manifest.new(
            manifest.CONVERT, MANIFEST_FORMAT, fingerprint=fp, role=job.role, options=job.options(),
            inputs={"model_dir": str(job.model_dir), "heads_dir": str(job.heads_dir) if job.heads_dir else None,
                    "files": files},
            outputs={"files": written}))
    return ConvertedCheckpoint(job.role, str(job.out_dir), config["architecture"], job.mapping.world_size, True,
                               time.perf_counter() - t0, fp)


# ------------------------------------------------------------------------------- reading


@dataclasses.dataclass
class Reassembled:
    """HF-named state dicts recovered from a TensorRT-LLM checkpoint."""

    config: dict[str, Any]
    target: Tensors
    medusa: Tensors | None = None
    eagle: Tensors | None = None


def shape_from_trtllm(cfg: dict[str, Any]) -> ModelConfig:
    return ModelConfig.from_trtllm(cfg)


def hf_config_from_trtllm(cfg: dict[str, Any]) -> dict[str, Any]:
    """The HF config keys equivalent to a TensorRT-LLM checkpoint config."""
    return ModelConfig.from_trtllm(cfg).to_hf_dict()


def read_checkpoint(ckpt_dir: Path) -> Reassembled:
    """Inverse of the writers for any TP/PP sharding (ConvertError if inconsistent)."""
    from trtspec.convert import llama_tensors

    ckpt_dir = Path(ckpt_dir)
    cfg = read_json_object(ckpt_dir / CONFIG, "checkpoint", ConvertError)
    m = cfg.get("mapping", {})
    mapping = Mapping(int(m.get("tp_size", 1)), int(m.get("pp_size", 1)))
    if int(m.get("world_size", mapping.world_size)) != mapping.world_size:
        raise ConvertError(f"{ckpt_dir}/config.json: mapping world_size != tp_size * pp_size")
    ranks = {}
    for rank in range(mapping.world_size):
        path = ckpt_dir / f"rank{rank}.safetensors"
        if not path.is_file():
            raise ConvertError(f"{path} is missing", hint="the checkpoint is incomplete; re-run `trtspec convert`")
        ranks[rank] = load_file(path, ConvertError)
    shape = shape_from_trtllm(cfg)
    out = Reassembled(cfg, llama_tensors.base_from_ranks(ranks, cfg, shape, mapping))
    arch = cfg.get("architecture")
    if arch == "MedusaForCausalLM":
        out.medusa = llama_tensors.medusa_from_ranks(ranks, cfg, mapping)
    elif arch == "EagleForCausalLM":
        eshape = shape_from_trtllm(cfg["eagle_net_config"])
        out.eagle = llama_tensors.eagle_from_ranks(ranks, cfg, eshape, mapping, out.target["model.embed_tokens.weight"])
    return out


__all__ = ["ConvertJob", "ConvertedCheckpoint", "MANIFEST", "Reassembled", "hf_config_from_trtllm", "is_fresh",
           "read_checkpoint", "read_manifest", "run_job", "shape_from_trtllm"]
