"""Model configs: the one reader of Hugging Face `config.json` files, and RoPE through transformers.

`ModelConfig.from_dir(dir)` reads a checkpoint's config through `transformers.AutoConfig` (never with remote
code, never over the network), so every key spelling transformers accepts (`rope_scaling` or 5.x
`rope_parameters`, `type` or `rope_type`, attribute aliases of other architectures) is read the way
transformers itself reads it, and a config transformers would refuse (a wrong type, a rope type without its
keys) is refused here as one ModelError naming the file and the key. Defaults transformers would invent for
the shape keys are not trusted: a config missing one of `REQUIRED` is an error, not a 4096-wide model.

What the file says, not transformers' class defaults, decides the special tokens (`eos_token_ids`,
`bos_token_id`): LlamaConfig() has eos 2 and bos 1, a config that names none has none. A checkpoint's
`generation_config.json` adds its EOS ids (every one of them ends a reply, as in transformers' generate).

This module only parses: which architectures, activations and rope types a consumer can run is that
consumer's capability check (the torch runtime's in runtime/llama.py, the converter's in convert/hf.py).

transformers 5.x folds `rope_theta` and `rope_scaling` into `rope_parameters` ({"rope_type", "rope_theta",
"factor", ...}; 4.x spelled `type`); `rope_scaling` here is that dict normalised: None for the default rope,
else {"rope_type": kind, ...its parameters} without rope_theta (a field of its own) and without the
4.x `type` key. `rope_inv_freq` computes the frequencies with transformers' own functions.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.artifacts.fs import read_json, read_json_object
from trtspec.errors import ModelError, TrtspecError

if TYPE_CHECKING:
    import torch

CONFIG = "config.json"
# The decoder architectures trtspec reads (model_type -> HF class): one Llama-shaped decoder, whose options per
# architecture are the torch runtime's (runtime/architectures.py); the pair check and `check` accept these.
DECODER_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
                         "qwen3": "Qwen3ForCausalLM"}
GENERATION_CONFIG = "generation_config.json"
REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# ModelConfig field -> the HF config key it is read from (the rest are spelled alike).
HF_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
           "num_kv_heads": "num_key_value_heads"}
# The keys `trtspec check` shows of a checkpoint (and of heads dirs).
SUMMARY_KEYS = ("architectures", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "torch_dtype", "medusa_num_heads")
# Rope types whose frequencies depend on the sequence length: evaluated once, at the cache's length.
STATIC_AT_CACHE_LENGTH = ("dynamic", "longrope")
_NOT_SCALING = ("rope_theta", "rope_type", "type", "partial_rotary_factor")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The hyper-parameters of a decoder-only checkpoint that decide tensor shapes and maths."""

    model_type: str
    architectures: tuple[str, ...]
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "linear"|"llama3"|"dynamic"|..., ...}
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    sliding_window: int | None = None  # attention window of sliding layers (Mistral, Qwen2/3), None: none
    layer_types: tuple[str, ...] = ()  # per layer "full_attention" | "sliding_attention"; () = all alike
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    torch_dtype: str | None = None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)  # the file's keys
    source: str = dataclasses.field(default=CONFIG, compare=False)  # where it was read (for messages)

    # ------------------------------------------------------------------------------------ reading

    @classmethod
    def from_dir(cls, path: str | Path, error: type[TrtspecError] = ModelError) -> "ModelConfig":
        file = Path(path) / CONFIG
        raw = read_json_object(file, "checkpoint", error)
        if "model_type" not in raw:  # what trtspec always assumed of a config that names no architecture
            return cls.from_dict(raw, str(file), error)
        from transformers import AutoConfig

        hf = _guard(lambda: AutoConfig.from_pretrained(str(path), trust_remote_code=False, local_files_only=True),
                    str(file), error)
        cfg = cls._from_hf(hf, raw, str(file), error)
        more = generation_eos_ids(path)
        if more:  # every EOS of generation_config.json ends a reply too (Llama 3: <|eot_id|>, <|eom_id|>)
            cfg = dataclasses.replace(cfg, eos_token_ids=tuple(dict.fromkeys(cfg.eos_token_ids + more)))
        return cfg

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = CONFIG,
                  error: type[TrtspecError] = ModelError) -> "ModelConfig":
        from transformers import AutoConfig

        kw = {k: v for k, v in raw.items() if k != "model_type"}
        model_type = raw.get("model_type") or "llama"
        hf = _guard(lambda: AutoConfig.for_model(model_type, **kw), where, error)
        return cls._from_hf(hf, raw, where, error)

    @classmethod
    def _from_hf(cls, hf: Any, raw: dict[str, Any], where: str, error: type[TrtspecError]) -> "ModelConfig":
        aliases = getattr(hf, "attribute_map", {}) or {}
        missing = [k for k in REQUIRED if k not in raw and aliases.get(k) not in raw]
        if missing:
            raise error(f"{where}: missing key {missing[0]!r}", hint="is this a Hugging Face model config?")
        try:
            heads = int(hf.num_attention_heads)
            hidden = int(hf.hidden_size)
            kv = int(getattr(hf, "num_key_value_heads", None) or heads)
            theta, scaling, partial = _rope(hf)
            eos = raw.get("eos_token_id")
            cfg = cls(
                model_type=str(getattr(hf, "model_type", None) or raw.get("model_type") or "llama"),
                architectures=_names(raw.get("architectures")),
                vocab_size=int(hf.vocab_size), hidden_size=hidden, intermediate_size=int(hf.intermediate_size),
                num_layers=int(hf.num_hidden_layers), num_heads=heads, num_kv_heads=kv,
                head_dim=int(getattr(hf, "head_dim", None) or hidden // heads),
                hidden_act=str(getattr(hf, "hidden_act", "silu")),
                rms_norm_eps=float(getattr(hf, "rms_norm_eps", 1e-6)),
                rope_theta=theta, rope_scaling=scaling, partial_rotary_factor=partial,
                max_position_embeddings=int(getattr(hf, "max_position_embeddings", None) or 2048),
                tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
                attention_bias=bool(getattr(hf, "attention_bias", False)),
                mlp_bias=bool(getattr(hf, "mlp_bias", False)),
                sliding_window=_window(hf), layer_types=tuple(str(t) for t in getattr(hf, "layer_types", None) or ()),
                eos_token_ids=tuple(int(e) for e in eos) if isinstance(eos, list) else
                (() if eos is None else (int(eos),)),
                bos_token_id=raw.get("bos_token_id"),
                torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
                raw=dict(raw), source=where)
        except (TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
            raise error(f"{where}: cannot read it: {_one_line(exc)}", hint="re-export the checkpoint") from None
        if cfg.num_heads < 1 or cfg.num_kv_heads < 1 or cfg.num_heads % cfg.num_kv_heads:
            raise error(f"{where}: num_attention_heads {cfg.num_heads} is not a multiple of num_key_value_heads "
                        f"{cfg.num_kv_heads}", hint="the checkpoint config is inconsistent")
        return cfg

    @classmethod
    def from_trtllm(cls, cfg: dict[str, Any]) -> "ModelConfig":
        """The config of a TensorRT-LLM checkpoint (`config.json` beside `rank*.safetensors`), which spells
        the same numbers with its own keys (`head_size`, `norm_epsilon`, `rotary_base`, ...)."""
        heads = cfg["num_attention_heads"]
        scaling = cfg.get("rotary_scaling")
        return cls(
            model_type="llama", architectures=("LlamaForCausalLM",), vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"], intermediate_size=cfg.get("intermediate_size") or cfg["hidden_size"] * 4,
            num_layers=cfg["num_hidden_layers"], num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_size") or cfg.get("head_dim") or cfg["hidden_size"] // heads,
            hidden_act=cfg.get("hidden_act", "silu"), rms_norm_eps=cfg.get("norm_epsilon", 1e-5),
            rope_theta=cfg.get("rotary_base", 10000.0),
            rope_scaling={k: v for k, v in scaling.items() if k != "type"} if scaling else None,
            max_position_embeddings=cfg.get("max_position_embeddings") or 2048,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings")), attention_bias=bool(cfg.get("attn_bias")),
            mlp_bias=bool(cfg.get("mlp_bias")), torch_dtype=cfg.get("dtype"), source="TensorRT-LLM config.json")

    # ------------------------------------------------------------------------------------ writing

    def to_hf(self):
        """The transformers config of these numbers (what transformers' rope functions and models take)."""
        from transformers import AutoConfig

        rope = dict(self.rope_scaling or {})
        kw: dict[str, Any] = dict(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers, num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim, hidden_act=self.hidden_act,
            rms_norm_eps=self.rms_norm_eps, max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings, attention_bias=self.attention_bias,
            mlp_bias=self.mlp_bias, rope_theta=self.rope_theta, rope_scaling=rope or None,
            sliding_window=self.sliding_window,  # None said explicitly: MistralConfig's default is 4096
            use_sliding_window=self.sliding_window is not None)  # Qwen2/3 drop the window without it
        if self.layer_types:
            kw["layer_types"] = list(self.layer_types)
        if self.partial_rotary_factor != 1.0:
            kw["partial_rotary_factor"] = self.partial_rotary_factor
        if self.architectures:
            kw["architectures"] = list(self.architectures)
        if self.torch_dtype:
            kw["dtype"] = self.torch_dtype
        eos = self.eos_token_ids
        kw["eos_token_id"] = (list(eos) if len(eos) > 1 else eos[0]) if eos else None  # not the class default
        kw["bos_token_id"] = self.bos_token_id
        return AutoConfig.for_model(self.model_type, **kw)

    def to_hf_dict(self) -> dict[str, Any]:
        """The HF `config.json` keys of this config, in transformers' spelling."""
        return self.to_hf().to_dict()

    # ------------------------------------------------------------------------------------ numbers

    @property
    def architecture(self) -> str | None:
        return self.architectures[0] if self.architectures else None

    @property
    def rope_type(self) -> str:
        return (self.rope_scaling or {}).get("rope_type", "default")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Matmul weights of one decoder layer: q, k, v, o and the gated MLP (no norms, no biases)."""
        return self.hidden_size * (2 * self.q_size + 2 * self.kv_size) + 3 * self.hidden_size * self.intermediate_size

    @property
    def num_params(self) -> int:
        """Parameters of the matmul weights (embeddings and LM head included, norms not)."""
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.num_layers * self.layer_params + self.vocab_size * self.hidden_size + head

    @staticmethod
    def key(field: str) -> str:
        """The HF config key of a field (`num_heads` -> `num_attention_heads`)."""
        return HF_KEYS.get(field, field)

    def differences(self, other: "ModelConfig", fields: tuple[str, ...], whose: str = "the target's") -> list[str]:
        """"<key> <mine> differs from <whose> <theirs>" for every field in which the two disagree."""
        return [f"{self.key(f)} {getattr(self, f)} differs from {whose} {getattr(other, f)}"
                for f in fields if getattr(self, f) != getattr(other, f)]


def generation_eos_ids(path: str | Path) -> tuple[int, ...]:
    """The eos_token_id(s) of a checkpoint's generation_config.json (what `generate` stops at); () when it
    has none or the file is missing or unreadable (it only adds stop tokens to config.json's)."""
    eos = (read_json(Path(path) / GENERATION_CONFIG) or {}).get("eos_token_id")
    values = eos if isinstance(eos, list) else [eos]
    return tuple(int(e) for e in values if isinstance(e, int) and not isinstance(e, bool) and e >= 0)


def with_legacy_keys(raw: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
    """A config.json written by transformers 5 (`rope_parameters`, `dtype`) that transformers 4.x readers
    (and TensorRT-LLM's converters) read too: `rope_theta` and `torch_dtype` spelled beside them."""
    out = dict(raw)
    out.setdefault("rope_theta", cfg.rope_theta)
    if cfg.torch_dtype or raw.get("dtype"):
        out.setdefault("torch_dtype", cfg.torch_dtype or raw.get("dtype"))
    return out


def summary(raw: dict[str, Any]) -> dict[str, Any]:
    """The keys `trtspec check` shows of a config file."""
    return {k: raw[k] for k in SUMMARY_KEYS if k in raw}


def _rope(hf: Any) -> tuple[float, dict[str, Any] | None, float]:
    """(rope_theta, normalised rope_scaling, partial_rotary_factor) of a transformers config (4.x or 5.x)."""
    params = getattr(hf, "rope_parameters", None)
    if not isinstance(params, dict):  # transformers 4.x
        params = {"rope_theta": getattr(hf, "rope_theta", None), **(getattr(hf, "rope_scaling", None) or {})}
    kind = params.get("rope_type", params.get("type")) or "default"
    theta = params.get("rope_theta") or getattr(hf, "rope_theta", None) or 10000.0
    partial = params.get("partial_rotary_factor", getattr(hf, "partial_rotary_factor", None) or 1.0)
    scaling = None if kind == "default" else {"rope_type": kind, **{k: v for k, v in params.items()
                                                                  if k not in _NOT_SCALING}}
    return float(theta), scaling, float(partial)


def rope_inv_freq(cfg: ModelConfig, max_seq: int) -> tuple["torch.Tensor", float]:
    """(inverse frequencies [head_dim/2], attention scaling) as transformers computes them for the rope type.

    `dynamic` (NTK) rescales the base once the sequence outgrows `max_position_embeddings`, and `longrope`
    switches from its short to its long factors past `original_max_position_embeddings`; transformers does
    that per forward call, which would change the frequencies under already-cached keys. Here they are fixed:
    transformers' own function evaluated at `max_seq` (the cache's length), so identical to transformers while
    the cache fits the original window, and for longer caches scaled for `max_seq` from the start (static).
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = cfg.to_hf()
    fn = ROPE_INIT_FUNCTIONS.get(cfg.rope_type)
    if fn is None and cfg.rope_type == "default":  # 5.x keeps the default with the models
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        fn = LlamaRotaryEmbedding.compute_default_rope_parameters
    if fn is None:
        raise ModelError(f"{cfg.source}: rope type {cfg.rope_type!r} is unknown to transformers")
    inv_freq, scaling = fn(hf, seq_len=max_seq) if cfg.rope_type in STATIC_AT_CACHE_LENGTH else fn(hf)
    return inv_freq.float(), float(scaling)


def _window(hf: Any) -> int | None:
    """The sliding window transformers applies: Qwen2/3 keep `sliding_window` set while use_sliding_window
    is false (then no layer slides)."""
    w = getattr(hf, "sliding_window", None)
    if w is None or getattr(hf, "use_sliding_window", True) is False:
        return None
    return int(w)


def _names(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ((str(value),) if value else ())


def _guard(make, where: str, error: type[TrtspecError]):
    """Run a transformers config constructor; any refusal is one `error` naming the file."""
    try:
        return make()
    except Exception as exc:  # transformers raises ValueError, KeyError, TypeError and its own validation errors
        raise error(f"{where}: transformers cannot read it: {_one_line(exc)}",
                    hint="fix the key named above, or re-export the checkpoint") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
