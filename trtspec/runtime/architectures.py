"""The decoder architectures the torch runtime runs, and how each differs from Llama's.

Llama, Mistral, Qwen2/2.5 and Qwen3 are one decoder (runtime/llama.py: RMSNorm, rotary attention with GQA,
SiLU-gated MLP); what differs is a handful of options, read here from the checkpoint's `model_type`:

|model_type|HF class          |q/k/v bias           |o bias        |MLP bias|q/k RMSNorm|sliding window           |
|----------|------------------|---------------------|--------------|--------|-----------|-------------------------|
|llama     |LlamaForCausalLM  |config.attention_bias|attention_bias|mlp_bias|no         |no                       |
|mistral   |MistralForCausalLM|no                   |no            |no      |no         |config.sliding_window    |
|qwen2     |Qwen2ForCausalLM  |always               |no            |no      |no         |per layer (`layer_types`)|
|qwen3     |Qwen3ForCausalLM  |config.attention_bias|attention_bias|no      |yes        |per layer (`layer_types`)|

(what transformers' modeling_{llama,mistral,qwen2,qwen3}.py build). A bias the architecture does not have is
not read even when the checkpoint holds one, as transformers ignores it; one it has must be there.
An architecture not in the table is one ModelError naming it and listing these.
"""

from __future__ import annotations

import dataclasses

from trtspec.artifacts.hf import DECODER_ARCHITECTURES, ModelConfig
from trtspec.errors import ModelError


@dataclasses.dataclass(frozen=True)
class Architecture:
    model_type: str
    hf_class: str
    qkv_bias: bool | None  # None: as config.attention_bias
    o_bias: bool | None    # None: as config.attention_bias
    mlp_bias: bool | None  # None: as config.mlp_bias
    qk_norm: bool = False  # RMSNorm over head_dim on q and k, before RoPE
    sliding_window: bool = False  # honours config.sliding_window (per layer where layer_types say so)

    def biases(self, cfg: ModelConfig) -> dict[str, bool]:
        """{"qkv", "o", "mlp"}: which projections of this checkpoint carry a bias."""
        pick = lambda fixed, flag: flag if fixed is None else fixed  # noqa: E731
        return {"qkv": pick(self.qkv_bias, cfg.attention_bias), "o": pick(self.o_bias, cfg.attention_bias),
                "mlp": pick(self.mlp_bias, cfg.mlp_bias)}

    def windows(self, cfg: ModelConfig) -> list[int | None]:
        """Per layer: the sliding attention window (keys within `w` positions, itself included), or None."""
        if not self.sliding_window or cfg.sliding_window is None:
            return [None] * cfg.num_layers
        if cfg.layer_types:
            return [cfg.sliding_window if t == "sliding_attention" else None for t in cfg.layer_types]
        return [cfg.sliding_window] * cfg.num_layers


_D = DECODER_ARCHITECTURES
ARCHITECTURES = {a.model_type: a for a in (
    Architecture("llama", _D["llama"], None, None, None),
    Architecture("mistral", _D["mistral"], False, False, False, sliding_window=True),
    Architecture("qwen2", _D["qwen2"], True, False, False, sliding_window=True),
    Architecture("qwen3", _D["qwen3"], None, None, False, qk_norm=True, sliding_window=True),
)}
assert set(ARCHITECTURES) == set(_D), "every decoder architecture the artifacts layer reads has its options here"


def supported() -> str:
    return ", ".join(f"{a.hf_class} ({t})" for t, a in ARCHITECTURES.items())


def architecture(cfg: ModelConfig) -> Architecture:
    """The runtime's options for `cfg`, or one ModelError naming the architecture and listing the supported."""
    arch = ARCHITECTURES.get(cfg.model_type)
    if arch is None:
        name = cfg.architecture or cfg.model_type
        raise ModelError(f"{cfg.source}: architecture {name!r} (model_type {cfg.model_type!r}) is not supported "
                         "by the torch runtime", hint=f"supported architectures: {supported()}")
    return arch
