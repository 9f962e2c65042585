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

EAGLE-3 (arXiv 2503.01840; the layout sgl-project/SpecForge writes and vllm-project/vllm's
`vllm/model_executor/models/llama_eagle3.py` / NVIDIA/TensorRT-LLM's
`tensorrt_llm/_torch/models/modeling_speculative.py` load)::

    heads/config.json                   architectures ["LlamaForCausalLMEagle3"], model_type llama,
                                        num_hidden_layers 1, hidden_size H, the layer's heads/ffn/rope,
                                        vocab_size V (the target's), draft_vocab_size Vd,
                                        target_hidden_size Ht, tie_word_embeddings false,
                                        eagle_aux_hidden_state_layer_ids  [i+1 ...]   (vLLM: layer INPUTS)
                                        eagle_config.eagle_aux_hidden_state_layer_ids [i ...] (SpecForge,
                                        TensorRT-LLM's eagle3_layers_to_capture: layer OUTPUTS)
    heads/model.safetensors             "fc.weight" [H, 3Ht], "midlayer.input_layernorm.weight" [H],
                                        "midlayer.hidden_norm.weight" [H], "midlayer.self_attn.{q,k,v}_proj.weight"
                                        [*, 2H], "midlayer.self_attn.o_proj.weight", "midlayer.post_attention_
                                        layernorm.weight", "midlayer.mlp.{gate,up,down}_proj.weight",
                                        "norm.weight" [H], "lm_head.weight" [Vd, H], "d2t" int64 [Vd],
                                        "t2d" bool [V]   (no embed_tokens: the target's is shared, frozen)

    features g_t = cat(h^(i1)_t, h^(i2)_t, h^(i3)_t): the residual stream after target layers i1 < i2 < i3
    (TensorRT-LLM's default {1, L//2-1, L-4}; vLLM numbers the same tensors as the inputs of layers
    {2, L//2, L-3}, so its top-level key holds each id + 1: both keys are written and read). At position t:
    a_t = fc(g_t); o_t = a_t + Attn(cat([input_layernorm(E[x_{t+1}]), hidden_norm(a_t)]))  (embeddings first,
    2H wide), o_t += MLP(post_attention_layernorm(o_t)); draft logits = lm_head(norm(o_t)) over the draft
    vocabulary predict x_{t+2}; draft id d is target id d + d2t[d]; t2d[v] says whether target id v is in it.
    Later drafting steps feed o_t itself (not through fc) as the next position's hidden input.

`eagle_version` tells EAGLE-3 heads from EAGLE-1 ones, so that the paths that run only EAGLE-1 refuse them.

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
            [f"{h}.{j}.linear.{p}" for j in range(num_layers) for p in ("weight", "bias")]
            + [f"{h}.{num_layers}.weight"]]


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
                    hint="EAGLE-3 heads run on runtime.kind \"torch\" and \"trtllm-llmapi\"")
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


# ----------------------------------------------------------------------------------------------- EAGLE-3

EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
_MID = "midlayer."
EAGLE3_TENSORS = ("fc.weight", _MID + "input_layernorm.weight", _MID + "hidden_norm.weight",
                  *(f"{_MID}self_attn.{p}_proj.weight" for p in "qkvo"), _MID + "post_attention_layernorm.weight",
                  *(f"{_MID}mlp.{p}_proj.weight" for p in ("gate", "up", "down")), "norm.weight", "lm_head.weight",
                  "d2t", "t2d")
AUX_KEY = "eagle_aux_hidden_state_layer_ids"


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """Target layers whose outputs an EAGLE-3 head reads: TensorRT-LLM's default (1, L//2-1, L-4) (needs
    L > 5; research B3), else spread over what there is (tiny test targets)."""
    if num_layers > 5:
        return 1, num_layers // 2 - 1, num_layers - 4
    return 0, (num_layers - 1) // 2, num_layers - 1


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
    layer: ModelConfig          # the midlayer's shape (its hidden size is the head's)
    draft_vocab_size: int
    target_hidden_size: int
    aux_layers: tuple[int, ...]  # target layers whose OUTPUTS are the features (TensorRT-LLM numbering);
    #                              () when the head names none and no target was given
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def differences(self, target: ModelConfig) -> list[str]:
        """What does not fit `target` (the shared embedding, the vocabulary, the captured layers)."""
        out = []
        if self.target_hidden_size != target.hidden_size:
            out.append(f"target_hidden_size {self.target_hidden_size} differs from the target's hidden_size "
                       f"{target.hidden_size}")
        if self.layer.hidden_size != target.hidden_size:
            out.append(f"hidden_size {self.layer.hidden_size} differs from the target's {target.hidden_size} "
                       "(the head reuses the target's embedding)")
        if self.layer.vocab_size != target.vocab_size:
            out.append(f"vocab_size {self.layer.vocab_size} differs from the target's {target.vocab_size}")
        if self.draft_vocab_size > self.layer.vocab_size:
            out.append(f"draft_vocab_size {self.draft_vocab_size} exceeds vocab_size {self.layer.vocab_size}")
        bad = [i for i in self.aux_layers if not 0 <= i < target.num_layers]
        if bad:
            out.append(f"captured layer {bad[0]} is not a layer of the target (it has {target.num_layers}: "
                       f"0..{target.num_layers - 1})")
        return out


def eagle3_raw_config(layer: dict[str, Any], *, vocab_size: int, draft_vocab_size: int, target_hidden_size: int,
                      aux_layers: tuple[int, ...], **extra: Any) -> dict[str, Any]:
    """config.json of an EAGLE-3 head from its layer's Llama keys; both spellings of the captured layers."""
    ids = [int(i) for i in aux_layers]
    return {**layer, "architectures": [EAGLE3_ARCHITECTURE], "model_type": "llama", "num_hidden_layers": 1,
            "vocab_size": vocab_size, "draft_vocab_size": draft_vocab_size, "target_hidden_size": target_hidden_size,
            "tie_word_embeddings": False, AUX_KEY: [i + 1 for i in ids],
            "eagle_config": {AUX_KEY: ids, "use_aux_hidden_state": True}, **extra}


def eagle3_config(heads_dir: Path, target: ModelConfig | None = None, error: Error = ModelError) -> Eagle3Config:
    """An EAGLE-3 head's config.json. The captured layers come from `eagle_config.eagle_aux_hidden_state_layer_ids`
    (SpecForge: layer outputs), else the top-level `eagle_aux_hidden_state_layer_ids` (vLLM: layer inputs,
    so each id - 1), else the default for the target; both given must name the same layers."""
    path = Path(heads_dir) / CONFIG
    raw = read_json_object(path, "EAGLE-3 head", error)
    base = {} if target is None else {k: v for k, v in target.raw.items() if k not in TARGET_STACK_KEYS}
    kw = {k: v for k, v in {**base, **raw}.items() if k not in ("eagle_config", AUX_KEY, "architectures")}
    layer = ModelConfig.from_dict({**kw, "num_hidden_layers": 1}, str(path), error)

    aux = eagle3_aux_layers(raw, path, error)
    if aux is None:
        aux = default_aux_layers(target.num_layers) if target is not None else ()  # (): not named, no target

    def size(key: str, default: int) -> int:
        value = raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise error(f"{path}: {key} {value!r} is not an integer >= 1", hint="re-export the head")
        return value

    return Eagle3Config(layer, size("draft_vocab_size", layer.vocab_size),
                        size("target_hidden_size", layer.hidden_size), aux, raw)


def eagle3_aux_layers(raw: dict[str, Any], path: Path, error: Error = ModelError) -> tuple[int, ...] | None:
    """The captured layers an EAGLE-3 config names (layer-output numbering), None when it names none."""
    def ids(value: Any, key: str) -> tuple[int, ...] | None:
        if value is None:
            return None
        if (not isinstance(value, list) or len(value) != 3
                or any(isinstance(i, bool) or not isinstance(i, int) for i in value)):
            raise error(f"{path}: {key} {value!r} is not a list of 3 layer ids", hint="re-export the head")
        return tuple(value)

    nested = raw.get("eagle_config") if isinstance(raw.get("eagle_config"), dict) else {}
    post = ids(nested.get(AUX_KEY), f"eagle_config.{AUX_KEY}")
    pre = ids(raw.get(AUX_KEY), AUX_KEY)
    if post is not None and pre is not None and tuple(i - 1 for i in pre) != post:
        raise error(f"{path}: {AUX_KEY} {list(pre)} (vLLM: layer inputs) and eagle_config.{AUX_KEY} {list(post)} "
                    "(layer outputs) name different layers", hint="the top-level ids must be the nested ones + 1")
    return post if post is not None else tuple(i - 1 for i in pre) if pre is not None else None


def load_eagle3(heads_dir: Path, target: ModelConfig, error: Error = ModelError) -> tuple[Eagle3Config, "Tensors"]:
    """(config, tensors without a "model." prefix) of an EAGLE-3 head that fits `target`, every tensor of
    the layout there with its shape."""
    cfg = eagle3_config(heads_dir, target, error)
    if bad := cfg.differences(target):
        raise error(f"{heads_dir}: EAGLE-3 head {bad[0]}", hint="use an EAGLE-3 head trained on this target")
    w = {k.removeprefix("model."): v for k, v in load_weights(heads_dir, EAGLE_WEIGHTS, error).items()}
    if missing := [k for k in EAGLE3_TENSORS if k not in w]:
        raise error(f"{heads_dir}/{EAGLE_WEIGHTS}: missing tensor {missing[0]!r}",
                    hint="an EAGLE-3 head has " + ", ".join(EAGLE3_TENSORS))
    H, c = cfg.layer.hidden_size, cfg.layer
    want = {"fc.weight": (H, 3 * cfg.target_hidden_size), "lm_head.weight": (cfg.draft_vocab_size, H),
            "d2t": (cfg.draft_vocab_size,), "t2d": (c.vocab_size,), "norm.weight": (H,),
            _MID + "self_attn.q_proj.weight": (c.q_size, 2 * H), _MID + "self_attn.k_proj.weight": (c.kv_size, 2 * H),
            _MID + "self_attn.v_proj.weight": (c.kv_size, 2 * H), _MID + "self_attn.o_proj.weight": (H, c.q_size),
            _MID + "mlp.gate_proj.weight": (c.intermediate_size, H),
            _MID + "mlp.down_proj.weight": (H, c.intermediate_size)}
    for k, shape in want.items():
        if tuple(w[k].shape) != shape:
            raise error(f"{heads_dir}/{EAGLE_WEIGHTS}: {k} has shape {list(w[k].shape)}, the config gives "
                        f"{list(shape)}", hint="config.json must describe the head in the weights file")
    ids = w["d2t"].long() + _arange(cfg.draft_vocab_size)
    if int(ids.min()) < 0 or int(ids.max()) >= c.vocab_size or not bool(w["t2d"].bool()[ids].all()):
        raise error(f"{heads_dir}: d2t maps draft ids outside the vocabulary or off t2d",
                    hint="target id = draft id + d2t[draft id], and t2d marks exactly those")
    return cfg, w


def vocab_tensors(used: "torch.Tensor", vocab_size: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """(d2t, t2d) of the draft vocabulary `used` (target ids; SpecForge's process_token_dict_to_mappings:
    sorted, d2t[i] = used[i] - i, t2d[v] = v in used)."""
    import torch

    used = torch.as_tensor(used, dtype=torch.long).unique(sorted=True)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(len(used)), t2d


def write_eagle3(out: Path, tensors: "Tensors", config: dict[str, Any]) -> None:
    """Write an EAGLE-3 head dir: exactly the layout's tensors (d2t int64, t2d bool) and its config.json."""
    import torch

    if sorted(tensors) != sorted(EAGLE3_TENSORS):
        raise ValueError(f"EAGLE-3 tensors {sorted(tensors)} are not the layout's {sorted(EAGLE3_TENSORS)}")
    tensors = {**tensors, "d2t": tensors["d2t"].to(torch.int64), "t2d": tensors["t2d"].to(torch.bool)}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_weights({k: v.contiguous() for k, v in tensors.items()}, out / EAGLE_WEIGHTS)
    write_json(out / CONFIG, config)


def _arange(n: int):
    import torch

    return torch.arange(n)
