"""Stage 4 of `trtspec train`, export: each kind's trained module written, fp16, in the layout its method
loads (trtspec.artifacts.heads: EAGLE-3, EAGLE-1 and Medusa heads; a LlamaForCausalLM dir with the target's
tokenizer for draft-model)."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from trtspec.artifacts import heads as layouts
from trtspec.artifacts.fs import read_json, write_json
from trtspec.artifacts.hf import CONFIG, ModelConfig, with_legacy_keys

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "chat_template.jinja", "generation_config.json")


def write_eagle3_head(d: Path, head: torch.nn.Module, layer: ModelConfig, target: ModelConfig,
                      aux: Sequence[int]) -> None:
    """An EAGLE-3 head (train.eagle3_head.Eagle3Head) in its layout: the midlayer `layer` reading the target's
    `aux` layers, its draft vocabulary mapped to the target's (d2t)."""
    raw = layouts.eagle3_raw_config(
        _layer_keys(layer), vocab_size=target.vocab_size, draft_vocab_size=head.draft_vocab_size,
        target_hidden_size=target.hidden_size, aux_layers=aux, torch_dtype="float16")
    layouts.write_eagle3(d, {k: (v.half() if v.is_floating_point() else v).cpu()
                             for k, v in head.layout_tensors().items()}, raw)


def write_eagle1(d: Path, head: torch.nn.Module, layer: ModelConfig, base: str) -> None:
    """An EAGLE-1 head (train.modules.EagleHead) in its layout, fp16: fc + one decoder layer, and the layer's
    config marked eagle (fc has a bias), naming its target `base`."""
    raw = {**layer.to_hf_dict(), "eagle": True, "bias": True, "base_model_name_or_path": base}
    layouts.write_eagle(d, {k: v.detach().half().cpu() for k, v in head.state_dict().items()},
                        with_legacy_keys(raw, layer))


def write_medusa_heads(d: Path, heads: torch.nn.Module, lm: torch.Tensor, used: torch.Tensor, target: ModelConfig,
                       base: str) -> None:
    """Medusa heads (train.modules.VocabMedusa) in the TensorRT-LLM Medusa layout: the trained lm_head rows of
    the draft vocabulary `used` over the target's `lm`, naming the target `base`."""
    layouts.write_medusa(d, {k: v.half().cpu() for k, v in heads.layout_tensors(lm, used).items()},
                         hidden_size=target.hidden_size, vocab_size=target.vocab_size, num_layers=1,
                         base_model_name_or_path=base)


def write_draft_model(d: Path, model: torch.nn.Module, config: ModelConfig, target: Path) -> None:
    """A distilled draft: a LlamaForCausalLM dir (fp16 safetensors, its config with the legacy keys) and the
    target's tokenizer files beside it (the draft-model method wants the same tokenizer)."""
    model.to(torch.float16).save_pretrained(str(d))
    model.to(torch.float32)
    write_json(d / CONFIG, with_legacy_keys(read_json(d / CONFIG) or {}, config))
    for name in TOKENIZER_FILES:
        if (Path(target) / name).is_file():
            shutil.copyfile(Path(target) / name, Path(d) / name)


def _layer_keys(c: ModelConfig) -> dict[str, Any]:
    keys = {"hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_attention_heads": c.num_heads, "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim,
            "hidden_act": c.hidden_act, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
            "max_position_embeddings": c.max_position_embeddings, "attention_bias": False, "mlp_bias": False}
    if c.rope_scaling:
        keys["rope_scaling"] = dict(c.rope_scaling)
    if c.bos_token_id is not None:
        keys["bos_token_id"] = c.bos_token_id
    if c.eos_token_ids:
        keys["eos_token_id"] = list(c.eos_token_ids) if len(c.eos_token_ids) > 1 else c.eos_token_ids[0]
    return keys
