"""The torch speculative-decoding runtime: a compact Llama, a static KV cache, drafters, sampling and the
SpecEngine scheduler (continuous batching).

    engine = SpecEngine.from_spec(spec)                  # target + drafter + tokenizer as the spec says
    engine.tokenizer, engine.method, engine.k_max
    engine.generate(prompt: str | list[int], params) -> GenerationResult
    engine.generate_batch(prompts, params | list[params]) -> list[GenerationResult]   # decoded together
    engine.stream(prompt, params) -> Iterator[StepEvent]
    engine.submit(prompt_ids, params, on_event) -> request id    # background scheduler thread
    engine.cancel(request_id); engine.close()

SamplingParams(max_new_tokens=128, temperature=0.0, top_k=0, top_p=1.0, seed=None, stop=(), end_id=None,
num_draft_tokens=None): temperature 0 is greedy; end_id None = the model's EOS, -1 = none; num_draft_tokens
None = the spec's K with adaptive control, 0 = plain decoding, n = fixed K (<= the spec's K). Invalid
requests raise trtspec.errors.GenerationError (from generate/stream/submit alike): temperature must be 0 or
finite >= 1e-5, top_k an integer >= 0, 0 < top_p <= 1, seed in [0, 2^64), end_id -1 or a token id, at most 16
stop strings of at most 256 characters. A request's output does not depend on what it is batched with: greedy, and
seeded sampling too (its random stream is its own), up to the rounding of batched matmuls (bf16 drafters
round a batch differently from one row).

Modules: llama.py (model), cache.py (KV cache, masks), sampling.py (distributions, acceptance rules),
drafters.py (none, draft-model, medusa, eagle, lookahead), engine.py (scheduler, API)."""

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
