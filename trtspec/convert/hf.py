"""Reading Hugging Face checkpoints: `config.json` into a typed shape, weights into a state dict.

Only what conversion needs: no model is instantiated, nothing from transformers is imported.
Weights come from `model.safetensors`, a sharded `model.safetensors.index.json`, or (as a last
resort) `pytorch_model.bin` loaded with `weights_only=True`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.errors import ConvertError

if TYPE_CHECKING:  # torch is imported only when tensors are touched (keeps cache checks fast)
    import torch

# Architectures whose weights the Llama converter understands (HF `architectures[0]`).
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)
# What the converter writes, per role: the TensorRT-LLM `architecture` of the checkpoint.
TRTLLM_ARCHITECTURES = ("LlamaForCausalLM", "MedusaForCausalLM", "EagleForCausalLM")

DTYPE_NAMES_ = ("float32", "float16", "bfloat16")


def torch_dtype(name: str) -> "torch.dtype":
    import torch

    if name not in DTYPE_NAMES_:
        raise ConvertError(f"unsupported dtype {name!r}", hint=f"use one of {', '.join(DTYPE_NAMES_)}")
    return getattr(torch, name)


@dataclasses.dataclass(frozen=True)
class LlamaShape:
    """The hyper-parameters of a Llama-family checkpoint that decide tensor shapes and maths."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int | None
    hidden_act: str
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    torch_dtype: str | None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{path} not found", hint="point the spec at an HF-format checkpoint dir") from None
    except (OSError, ValueError) as exc:  # ValueError: json.JSONDecodeError and UnicodeDecodeError
        raise ConvertError(f"{path}: cannot read JSON: {exc}", hint="re-export the checkpoint") from None
    if not isinstance(data, dict):  # every caller indexes it as an object
        raise ConvertError(f"{path}: not a JSON object", hint="re-export the checkpoint")
    return data


def _rope(cfg: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from transformers 4.x keys or 5.x `rope_parameters`."""
    params = cfg.get("rope_parameters")
    theta = cfg.get("rope_theta")
    scaling = cfg.get("rope_scaling")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        kind = params.get("rope_type", params.get("type", "default"))
        if kind not in (None, "default") and scaling is None:
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if isinstance(scaling, dict):
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind in (None, "default"):
            scaling = None
        else:
            # TensorRT-LLM reads `type` (older) or `rope_type` (newer): write both.
            scaling = {**scaling, "type": kind, "rope_type": kind}
    return float(theta if theta is not None else 10000.0), scaling


def llama_shape(cfg: dict[str, Any], where: str = "config.json", *, architecture: str | None = None) -> LlamaShape:
    """Typed Llama shape of an HF config dict; ConvertError names the missing key."""
    arch = architecture or (cfg.get("architectures") or [None])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConvertError(
            f"{where}: architecture {arch!r} is not supported by the TensorRT-LLM converter",
            hint=f"supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)} "
                 "(plus Medusa heads and EAGLE-1 heads on top of them)")
    try:
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        shape = LlamaShape(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg.get("intermediate_size") or hidden * 4),
            num_hidden_layers=int(cfg["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            max_position_embeddings=cfg.get("max_position_embeddings"),
            hidden_act=str(cfg.get("hidden_act", "silu")),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope(cfg)[0],
            rope_scaling=_rope(cfg)[1],
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
        )
    except KeyError as exc:
        raise ConvertError(f"{where}: missing key {exc.args[0]!r}", hint="re-export the checkpoint") from None
    if shape.num_attention_heads % shape.num_key_value_heads:
        raise ConvertError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                           f"{shape.num_key_value_heads}", hint="the checkpoint config is inconsistent")
    return shape


def load_config(model_dir: Path) -> dict[str, Any]:
    return read_json(Path(model_dir) / "config.json")


def weight_files(model_dir: Path) -> list[Path]:
    """The files holding a checkpoint's weights (what conversion reads and fingerprints)."""
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(read_json(index).get("weight_map", {}).values()))
        return [d / n for n in names]
    for name in ("model.safetensors", "medusa_lm_head.safetensors", "medusa_lm_head.pt", "pytorch_model.bin"):
        if (d / name).is_file():
            return [d / name]
    found = sorted(d.glob("*.safetensors"))
    if found:
        return found
    raise ConvertError(f"{d}: no weights found (model.safetensors, an index, or pytorch_model.bin)",
                       hint="point the spec at a checkpoint directory with its weights")


def load_tensors(path: Path) -> dict[str, "torch.Tensor"]:
    import torch

    path = Path(path)
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt file, wrong format
        raise ConvertError(f"{path}: cannot read weights: {exc}", hint="re-download or re-export the file") from None


def load_state_dict(model_dir: Path) -> dict[str, "torch.Tensor"]:
    sd: dict[str, "torch.Tensor"] = {}
    for f in weight_files(model_dir):
        sd.update(load_tensors(f))
    return sd


def need(sd: dict[str, "torch.Tensor"], key: str, where: str, shape: tuple[int, ...] | None = None) -> "torch.Tensor":
    if key not in sd:
        raise ConvertError(f"{where}: weight {key!r} is missing", hint="the checkpoint is incomplete or not Llama-like")
    t = sd[key]
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ConvertError(f"{where}: weight {key!r} has shape {tuple(t.shape)}, expected {tuple(shape)}",
                           hint="the weights do not match config.json")
    return t
