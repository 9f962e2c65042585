"""What the TensorRT-LLM converter reads of a Hugging Face checkpoint, and its capability check.

The config is `trtspec.artifacts.hf.ModelConfig` and the weights come from `trtspec.artifacts.weights`
(safetensors only); this module adds what conversion needs on top: the architectures the Llama converter
understands, the TensorRT-LLM spelling of RoPE scaling, torch dtypes by name, and ConvertError (exit 4)
for every failure, naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.artifacts.fs import read_json_object
from trtspec.artifacts.hf import CONFIG, ModelConfig
from trtspec.errors import ConvertError

if TYPE_CHECKING:  # torch is imported only when tensors are touched (keeps cache checks fast)
    import torch

# Architectures whose weights the Llama converter understands (HF `architectures[0]`): the Llama family as
# TensorRT-LLM's own Llama converter takes it (Mistral's weights are Llama's; its sliding window is TensorRT-LLM's
# runtime `max_attention_window_size`, not a checkpoint key). Qwen2/Qwen3 and the rest go through
# `trtllm-llmapi`, which reads Hugging Face checkpoints itself.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM")
# What the converter writes, per role: the TensorRT-LLM `architecture` of the checkpoint.
TRTLLM_ARCHITECTURES = ("LlamaForCausalLM", "MedusaForCausalLM", "EagleForCausalLM")

DTYPE_NAMES_ = ("float32", "float16", "bfloat16")


def torch_dtype(name: str) -> "torch.dtype":
    import torch

    if name not in DTYPE_NAMES_:
        raise ConvertError(f"unsupported dtype {name!r}", hint=f"use one of {', '.join(DTYPE_NAMES_)}")
    return getattr(torch, name)


def model_config(model_dir: Path) -> ModelConfig:
    """The checkpoint's config, if the converter understands its architecture (ConvertError otherwise)."""
    where = Path(model_dir) / CONFIG
    archs = read_json_object(where, "checkpoint", ConvertError).get("architectures") or [None]
    arch = archs[0] if isinstance(archs, list) else archs
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConvertError(
            f"{where}: architecture {arch!r} is not supported by the TensorRT-LLM converter",
            hint=f"the converter takes the Llama family: {', '.join(SUPPORTED_ARCHITECTURES)} (plus Medusa heads "
                 "and EAGLE-1 heads on top of them); for other architectures use runtime.kind = \"trtllm-llmapi\", "
                 "which reads Hugging Face checkpoints directly")
    return ModelConfig.from_dir(model_dir, ConvertError)


def rope_scaling(cfg: ModelConfig) -> dict[str, Any] | None:
    """`rotary_scaling` of a TensorRT-LLM config: TensorRT-LLM reads `type` (older) or `rope_type` (newer),
    so both are written."""
    return {**cfg.rope_scaling, "type": cfg.rope_type} if cfg.rope_scaling else None


def need(sd: dict[str, "torch.Tensor"], key: str, where: str, shape: tuple[int, ...] | None = None) -> "torch.Tensor":
    if key not in sd:
        raise ConvertError(f"{where}: weight {key!r} is missing", hint="the checkpoint is incomplete or not Llama-like")
    t = sd[key]
    if shape is not None and tuple(t.shape) != tuple(shape):
        raise ConvertError(f"{where}: weight {key!r} has shape {tuple(t.shape)}, expected {tuple(shape)}",
                           hint="the weights do not match config.json")
    return t
