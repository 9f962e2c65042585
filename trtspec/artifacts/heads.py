"""Draft-head layouts on disk: one reader and one writer per layout.

Medusa (TensorRT-LLM converter layout)::

    heads/config.json                   {"medusa_num_heads": N, "medusa_num_layers": L, "hidden_size": H,
                                         "vocab_size": V, ...}
    heads/medusa_lm_head.safetensors    "{h}.{l}.linear.weight" [H, H], "{h}.{l}.linear.bias" [H]  (l < L)
                                        "{h}.{L}.weight" [V, H]                                    (h < N)

    head h: x = f + silu(W_{h,l} x + b_{h,l}) for each layer l (x starts as f, the target's final, post-norm
    hidden state at position t), logits_h = L_h x; it predicts token t+2+h (the target's own LM head
    predicts t+1).

EAGLE-1 (one Llama decoder layer over [embedding, feature]; no embedding, LM head, final norm or input norm
of its own: it reuses the target's)::

    heads/config.json                   a Llama config (num_hidden_layers 1); keys it lacks are the target's
    heads/model.safetensors             "fc.weight" [H, 2H], "fc.bias" [H] (optional),
                                        "layers.0.self_attn.{q,k,v,o}_proj.weight", "layers.0.mlp.{gate,up,down}
                                        _proj.weight", "layers.0.post_attention_layernorm.weight"
                                        (a "model." prefix is accepted)

    at position t: z_t = fc(cat([E[x_{t+1}], f_t])) (embedding first, feature second) runs through the layer
    (causal attention with the target's RoPE) to f^_{t+1}; the target's lm_head(f^_{t+1}) predicts x_{t+2}.
    f_t are the target's features while known, then the head's own outputs.

EAGLE-3 heads (`midlayer.*`, `d2t`/`t2d`, an `...Eagle3...` architecture) are recognised (`eagle_version`)
so that the paths that run only EAGLE-1 can refuse them.

Errors take the caller's failure class (ModelError when checking or serving, ConvertError when converting).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.artifacts.fs import read_json_object, write_json
from trtspec.artifacts.hf import CONFIG, ModelConfig
from trtspec.artifacts.weights import MODEL_WEIGHTS, load_weights, save_weights, tensor_names
from trtspec.errors import ModelError, TrtspecError

if TYPE_CHECKING:
    import torch

    Tensors = dict[str, torch.Tensor]

MEDUSA_WEIGHTS = "medusa_lm_head.safetensors"
EAGLE_WEIGHTS = MODEL_WEIGHTS
# What must agree between a head and its target.
MEDUSA_FIT = ("hidden_size", "vocab_size")
EAGLE_FIT = ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size")
Error = type[TrtspecError]

# ------------------------------------------------------------------------------------------------ Medusa


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
    num_heads: int
    num_layers: int
    hidden_size: int | None  # None: not recorded (the target's)
    vocab_size: int | None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def differences(self, target: ModelConfig) -> list[str]:
        return [f"{k} {getattr(self, k)} differs from the target's {getattr(target, k)}"
                for k in MEDUSA_FIT if getattr(self, k) is not None and getattr(self, k) != getattr(target, k)]


def medusa_config(heads_dir: Path, error: Error = ModelError) -> MedusaConfig:
    """The heads dir's config.json; `error` when it has no usable medusa_num_heads (an integer >= 1)."""
    path = Path(heads_dir) / CONFIG
    cfg = read_json_object(path, "Medusa heads", error)

    def count(key: str, default: int | None) -> int:
        value = default if cfg.get(key) is None else cfg[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            shown = "missing" if key not in cfg else f"{value!r}, not an integer >= 1"
            raise error(f"{path}: {key} {shown}",
                        hint="a Medusa heads dir has config.json with medusa_num_heads (and medusa_num_layers)")
        return value

    def size(key: str) -> int | None:
        value = cfg.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise error(f"{path}: {key} {value!r} is not an integer", hint="re-export the heads")
        return value

    return MedusaConfig(count("medusa_num_heads", None), count("medusa_num_layers", 1), size("hidden_size"),
                        size("vocab_size"), cfg)


def medusa_num_heads(heads_dir: Path, error: Error = ModelError) -> int:
    return medusa_config(heads_dir, error).num_heads


def medusa_keys(num_heads: int, num_layers: int) -> list[str]:
    """Every tensor name of the layout, head by head."""
    return [k for h in range(num_heads) for k in
            [f"{h}.{l}.linear.{p}" for l in range(num_layers) for p in ("weight", "bias")] + [f"{h}.{num_layers}.weight"]]


def load_medusa(heads_dir: Path, target: ModelConfig | None = None,
                error: Error = ModelError) -> tuple[MedusaConfig, "Tensors"]:
    """(config, tensors) of a Medusa heads dir; with `target`, its sizes must be the target's."""
    cfg = medusa_config(heads_dir, error)
    if target is not None and (bad := cfg.differences(target)):
        raise error(f"{heads_dir}: medusa heads {bad[0]}", hint="use heads trained on this target")
    w = load_weights(heads_dir, MEDUSA_WEIGHTS, error)
    missing = [k for k in medusa_keys(cfg.num_heads, cfg.num_layers) if k not in w]
    if missing:
        raise error(f"{heads_dir}/{MEDUSA_WEIGHTS}: missing tensor {missing[0]!r} "
                    f"({cfg.num_heads} heads of {cfg.num_layers} layer(s) in config.json)",
                    hint="config.json must describe the heads in the weights file")
    return cfg, w


def write_medusa(out: Path, tensors: "Tensors", *, hidden_size: int, vocab_size: int, num_layers: int = 1,
                 **extra: Any) -> None:
    """Write a Medusa heads dir (the number of heads is read off the tensor names)."""
    num_heads = len({k.split(".", 1)[0] for k in tensors})
    want = medusa_keys(num_heads, num_layers)
    if sorted(tensors) != sorted(want):
        raise ValueError(f"medusa tensors {sorted(tensors)} are not the layout's {want}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_weights(tensors, out / MEDUSA_WEIGHTS)
    write_json(out / CONFIG, {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers,
                              "hidden_size": hidden_size, "vocab_size": vocab_size, **extra})


# ------------------------------------------------------------------------------------------------- EAGLE

# Target keys that describe the target's own layer stack, not a one-layer head (Qwen2/3's per-layer
# attention kinds would not even validate against one layer).
TARGET_STACK_KEYS = ("layer_types", "max_window_layers")
_EAGLE3_TENSORS = re.compile(r"^(?:model\.)?midlayer\.|^d2t$|^t2d$")


def eagle_config(heads_dir: Path, target: ModelConfig | None = None, error: Error = ModelError) -> ModelConfig:
    """The head's decoder-layer config: its config.json over the target's keys (EAGLE-1 heads often record
    only what differs), the vocabulary always the target's."""
    path = Path(heads_dir) / CONFIG
    raw = read_json_object(path, "EAGLE head", error)
    if target is None:
        return ModelConfig.from_dict(raw, str(path), error)
    base = {k: v for k, v in target.raw.items() if k not in TARGET_STACK_KEYS}
    return ModelConfig.from_dict({**base, **raw, "vocab_size": target.vocab_size}, str(path), error)


def eagle_version(heads_dir: Path, error: Error = ModelError) -> int:
    """3 for an EAGLE-3 head, 1 for an EAGLE-1/2 head (by its architectures and tensor names)."""
    heads_dir = Path(heads_dir)
    cfg = read_json_object(heads_dir / CONFIG, "EAGLE head", error)
    if any("eagle3" in str(a).lower() for a in cfg.get("architectures") or []):
        return 3
    names = [n for f in sorted(heads_dir.glob("*.safetensors")) for n in tensor_names(heads_dir, f.name, error)]
    return 3 if any(_EAGLE3_TENSORS.match(n) for n in names) else 1


def load_eagle(heads_dir: Path, target: ModelConfig, error: Error = ModelError) -> tuple[ModelConfig, "Tensors"]:
    """(layer config, tensors without any "model." prefix) of an EAGLE-1 head fitting `target`."""
    cfg = eagle_config(heads_dir, target, error)
    if bad := cfg.differences(target, EAGLE_FIT):
        raise error(f"{heads_dir}: eagle head {bad[0]}", hint="the EAGLE head must be trained for this target")
    w = {k.removeprefix("model."): v for k, v in load_weights(heads_dir, EAGLE_WEIGHTS, error).items()}
    if any(_EAGLE3_TENSORS.match(k) for k in w):
        raise error(f"{heads_dir}: this is an EAGLE-3 head; only EAGLE-1/2 heads are supported here",
                    hint="use runtime.kind = \"trtllm-llmapi\" for EAGLE-3")
    if "fc.weight" not in w:
        raise error(f"{heads_dir}: eagle head has no fc.weight", hint="an EAGLE-1 head has fc.weight [H, 2H]")
    return cfg, w


def write_eagle(out: Path, tensors: "Tensors", config: Any) -> None:
    """Write an EAGLE-1 head dir: `config` (a dict or a transformers config) and the tensors."""
    if "fc.weight" not in tensors or any(_EAGLE3_TENSORS.match(k) for k in tensors):
        raise ValueError(f"not an EAGLE-1 layout: {sorted(tensors)}")
    raw = config.to_diff_dict() if hasattr(config, "to_diff_dict") else dict(config)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_weights(tensors, out / EAGLE_WEIGHTS)
    write_json(out / CONFIG, raw)
