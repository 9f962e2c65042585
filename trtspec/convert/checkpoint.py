"""Writing and reading TensorRT-LLM checkpoints (`config.json` + `rank{N}.safetensors`).

Writers take HF directories and produce a checkpoint directory atomically (a failed conversion
leaves the previous one untouched). `read_checkpoint` is the exact inverse: it reassembles the
HF state dicts (target, Medusa heads, EAGLE head) from any TP/PP sharding, checking every
replicated tensor agrees across ranks.

A `trtspec.convert.json` manifest beside the weights records what the checkpoint was made
from (source file digests + options); a conversion whose manifest matches is skipped.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable

from typing import TYPE_CHECKING

from trtspec import __version__
from trtspec.builders.lock import atomic_dir, digest, read_json, write_json
from trtspec.convert import hf
from trtspec.convert.fingerprint import content_only, file_digests
from trtspec.convert.mapping import Mapping
from trtspec.errors import ConvertError

if TYPE_CHECKING:
    import torch

MANIFEST = "trtspec.convert.json"
CONVERTER_VERSION = 1
Tensors = dict[str, "torch.Tensor"]


@dataclasses.dataclass(frozen=True)
class ConvertJob:
    """One checkpoint to write: what from, with which options, to where."""

    role: str                      # "target" | "draft"
    kind: str                      # "llama" | "medusa" | "eagle"
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
        files = {"model": [self.model_dir / "config.json", *hf.weight_files(self.model_dir)]}
        index = self.model_dir / "model.safetensors.index.json"
        if index.is_file():
            files["model"].append(index)
        if self.heads_dir is not None:
            files["heads"] = [self.heads_dir / "config.json", *hf.weight_files(self.heads_dir)]
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


def _heads_config(heads_dir: Path) -> dict[str, Any]:
    return hf.read_json(heads_dir / "config.json")


def _config_and_ranks(job: ConvertJob) -> tuple[dict[str, Any], Callable[[int, int, int], Tensors]]:
    from trtspec.convert import llama

    where = str(job.model_dir)
    cfg = hf.load_config(job.model_dir)
    shape = hf.llama_shape(cfg, f"{job.model_dir}/config.json")
    sd = hf.load_state_dict(job.model_dir)
    dtype = hf.torch_dtype(job.dtype)
    mapping = job.mapping
    if job.kind == "llama":
        config = llama.base_config(shape, job.dtype, mapping, shape.architecture)

        def ranks(rank, t, p):
            return llama.base_rank_weights(sd, shape, mapping, t, p, dtype, where)
        return config, ranks
    if job.kind == "medusa":
        assert job.heads_dir is not None
        hcfg = _heads_config(job.heads_dir)
        num_heads = int(hcfg.get("medusa_num_heads", 0) or 0)
        num_layers = int(hcfg.get("medusa_num_layers", 1) or 1)
        if num_heads < 1:
            raise ConvertError(f"{job.heads_dir}/config.json: medusa_num_heads missing",
                               hint="a Medusa heads dir needs config.json with medusa_num_heads")
        heads = hf.load_state_dict(job.heads_dir)
        config = llama.medusa_config(shape, job.dtype, mapping, num_heads=num_heads, num_layers=num_layers,
                                     max_draft_len=job.max_draft_len)

        def ranks(rank, t, p):
            w = llama.base_rank_weights(sd, shape, mapping, t, p, dtype, where)
            w.update(llama.medusa_rank_weights(heads, shape, mapping, t, p, num_heads, num_layers, dtype,
                                               str(job.heads_dir)))
            return w
        return config, ranks
    if job.kind == "eagle":
        assert job.heads_dir is not None
        ecfg = _heads_config(job.heads_dir)
        eshape = hf.llama_shape({**cfg, **ecfg, "vocab_size": shape.vocab_size}, f"{job.heads_dir}/config.json",
                                architecture="LlamaForCausalLM")
        if eshape.hidden_size != shape.hidden_size:
            raise ConvertError(f"{job.heads_dir}: EAGLE hidden_size {eshape.hidden_size} != target "
                               f"{shape.hidden_size}", hint="use the EAGLE head trained for this target")
        eagle = hf.load_state_dict(job.heads_dir)
        if any(k.startswith("midlayer.") for k in eagle) or "d2t" in eagle:
            raise ConvertError(f"{job.heads_dir}: this is an EAGLE-3 head; the TensorRT engine path supports "
                               "EAGLE-1/2 heads only", hint="use runtime.kind = \"trtllm-llmapi\" for EAGLE-3")
        config = llama.eagle_config(shape, eshape, job.dtype, mapping, max_draft_len=job.max_draft_len,
                                    num_eagle_layers=job.num_eagle_layers,
                                    max_non_leaves_per_layer=job.max_non_leaves_per_layer)

        def ranks(rank, t, p):
            w = llama.base_rank_weights(sd, shape, mapping, t, p, dtype, where)
            w.update(llama.eagle_rank_weights(eagle, eshape, sd, shape, mapping, t, job.num_eagle_layers, dtype,
                                              str(job.heads_dir)))
            return w
        return config, ranks
    raise ConvertError(f"unknown conversion kind {job.kind!r}")


def fingerprint(job: ConvertJob, previous: dict[str, Any] | None = None, use_cache: bool = True
                ) -> tuple[str, dict[str, Any]]:
    """Digest of the sources' CONTENT (keys relative to each source dir, so the same checkpoint
    checked out elsewhere, e.g. in another CI job, has the same fingerprint) and the options."""
    old = (previous or {}).get("sources") or {}
    files: dict[str, Any] = {}
    for label, paths in job.source_files().items():
        root = job.model_dir if label == "model" else job.heads_dir
        prev = {k.split("/", 1)[1]: v for k, v in old.items() if k.startswith(label + "/")}
        for k, v in file_digests(paths, root=root, previous=prev, use_cache=use_cache).items():
            files[f"{label}/{k}"] = v
    return digest({"sources": content_only(files), "options": job.options()}), files


def is_fresh(job: ConvertJob, use_cache: bool = True) -> tuple[bool, str, dict[str, Any]]:
    """(fresh, fingerprint, source digests): does `job.out_dir` hold exactly this conversion?"""
    manifest = read_manifest(job.out_dir)
    fp, files = fingerprint(job, manifest, use_cache)
    fresh = bool(manifest) and manifest.get("fingerprint") == fp and all(
        (job.out_dir / f).is_file() for f in ["config.json", *manifest.get("files", [])])
    return fresh, fp, files


def read_manifest(ckpt_dir: Path) -> dict[str, Any] | None:
    return read_json(Path(ckpt_dir) / MANIFEST)


def run_job(job: ConvertJob, force: bool = False, log: Callable[[str], None] | None = None) -> ConvertedCheckpoint:
    """Convert unless the checkpoint on disk was made from the same sources with the same options."""
    t0 = time.perf_counter()
    for d in (job.model_dir, job.heads_dir):
        if d is not None and not Path(d).is_dir():
            raise ConvertError(f"checkpoint dir not found: {d}", hint="check the paths in the spec")
    fresh, fp, files = is_fresh(job, use_cache=not force)
    if fresh and not force:
        cfg = hf.read_json(job.out_dir / "config.json")
        return ConvertedCheckpoint(job.role, str(job.out_dir), cfg["architecture"], job.mapping.world_size, False,
                                   time.perf_counter() - t0, fp)
    if log:
        log(f"converting {job.role} ({job.kind}, tp={job.tp}, pp={job.pp}, {job.dtype}) -> {job.out_dir}")
    config, ranks = _config_and_ranks(job)
    written = []
    from safetensors.torch import save_file

    with atomic_dir(job.out_dir) as tmp:
        (tmp / "config.json").write_text(json.dumps(config, indent=4) + "\n", encoding="utf-8")
        for rank, t, p in job.mapping.ranks():
            name = f"rank{rank}.safetensors"
            save_file(ranks(rank, t, p), str(tmp / name), metadata={"format": "pt"})
            written.append(name)
        write_json(tmp / MANIFEST, {
            "fingerprint": fp, "role": job.role, "options": job.options(), "sources": files,
            "model_dir": str(job.model_dir), "heads_dir": str(job.heads_dir) if job.heads_dir else None,
            "files": written, "trtspec": __version__,
        })
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


def shape_from_trtllm(cfg: dict[str, Any]) -> hf.LlamaShape:
    heads = cfg["num_attention_heads"]
    return hf.LlamaShape(
        architecture="LlamaForCausalLM", vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
        intermediate_size=cfg.get("intermediate_size") or cfg["hidden_size"] * 4,
        num_hidden_layers=cfg["num_hidden_layers"], num_attention_heads=heads,
        num_key_value_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_size") or cfg.get("head_dim") or cfg["hidden_size"] // heads,
        max_position_embeddings=cfg.get("max_position_embeddings"), hidden_act=cfg.get("hidden_act", "silu"),
        rms_norm_eps=cfg.get("norm_epsilon", 1e-5), rope_theta=cfg.get("rotary_base", 10000.0),
        rope_scaling=cfg.get("rotary_scaling"), tie_word_embeddings=bool(cfg.get("tie_word_embeddings")),
        attention_bias=bool(cfg.get("attn_bias")), mlp_bias=bool(cfg.get("mlp_bias")), torch_dtype=cfg.get("dtype"),
    )


def hf_config_from_trtllm(cfg: dict[str, Any]) -> dict[str, Any]:
    """The HF `LlamaConfig` keys equivalent to a TensorRT-LLM checkpoint config."""
    s = shape_from_trtllm(cfg)
    out = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": s.vocab_size,
           "hidden_size": s.hidden_size, "intermediate_size": s.intermediate_size,
           "num_hidden_layers": s.num_hidden_layers, "num_attention_heads": s.num_attention_heads,
           "num_key_value_heads": s.num_key_value_heads, "head_dim": s.head_dim,
           "max_position_embeddings": s.max_position_embeddings, "hidden_act": s.hidden_act,
           "rms_norm_eps": s.rms_norm_eps, "rope_theta": s.rope_theta, "tie_word_embeddings": s.tie_word_embeddings,
           "attention_bias": s.attention_bias, "mlp_bias": s.mlp_bias, "torch_dtype": s.torch_dtype}
    if s.rope_scaling:
        out["rope_scaling"] = {k: v for k, v in s.rope_scaling.items() if k != "type"}
    return out


def read_checkpoint(ckpt_dir: Path) -> Reassembled:
    """Inverse of the writers for any TP/PP sharding (ConvertError if inconsistent)."""
    from safetensors.torch import load_file

    from trtspec.convert import llama

    ckpt_dir = Path(ckpt_dir)
    cfg = hf.read_json(ckpt_dir / "config.json")
    m = cfg.get("mapping", {})
    mapping = Mapping(int(m.get("tp_size", 1)), int(m.get("pp_size", 1)))
    if int(m.get("world_size", mapping.world_size)) != mapping.world_size:
        raise ConvertError(f"{ckpt_dir}/config.json: mapping world_size != tp_size * pp_size")
    ranks = {}
    for rank in range(mapping.world_size):
        path = ckpt_dir / f"rank{rank}.safetensors"
        if not path.is_file():
            raise ConvertError(f"{path} is missing", hint="the checkpoint is incomplete; re-run `trtspec convert`")
        ranks[rank] = load_file(str(path))
    shape = shape_from_trtllm(cfg)
    out = Reassembled(cfg, llama.base_from_ranks(ranks, cfg, shape, mapping))
    arch = cfg.get("architecture")
    if arch == "MedusaForCausalLM":
        out.medusa = llama.medusa_from_ranks(ranks, cfg, mapping)
    elif arch == "EagleForCausalLM":
        eshape = shape_from_trtllm(cfg["eagle_net_config"])
        out.eagle = llama.eagle_from_ranks(ranks, cfg, eshape, mapping, out.target["model.embed_tokens.weight"])
    return out


__all__ = ["ConvertJob", "ConvertedCheckpoint", "MANIFEST", "Reassembled", "hf_config_from_trtllm", "is_fresh",
           "read_checkpoint", "read_manifest", "run_job", "shape_from_trtllm"]
