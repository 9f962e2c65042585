"""The torch speculative-decoding runtime: a compact Llama, a static KV cache, drafters, sampling and the
SpecEngine scheduler (continuous batching). `SpecEngine.from_spec(spec)` is the entry point."""

from trtspec.runtime.drafters import (Draft, Drafter, DraftModelDrafter, EagleDrafter, MedusaDrafter, NgramDrafter,
                                      make_drafter)
from trtspec.runtime.engine import AdaptiveConfig, GenerationResult, SpecEngine, StepEvent
from trtspec.runtime.llama import Llama, LlamaConfig
from trtspec.runtime.sampling import SamplingParams

__all__ = [
    "SpecEngine", "SamplingParams", "StepEvent", "GenerationResult", "AdaptiveConfig",
    "Llama", "LlamaConfig", "Draft", "Drafter", "DraftModelDrafter", "MedusaDrafter", "EagleDrafter",
    "NgramDrafter", "make_drafter",
]
