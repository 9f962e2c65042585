"""The torch speculative-decoding runtime: a compact Llama, a static KV cache, proposers, a rejection sampler
and the SpecEngine (scheduler with continuous batching).

    engine = SpecEngine.from_spec(spec, proposer)        # target + tokenizer as the spec says, around a proposer
    engine = trtspec.methods.engine(spec)                # ... with the spec's method's proposer (composed there)
    engine.tokenizer, engine.method, engine.k_max
    engine.generate(prompt: str | list[int], params) -> GenerationResult
    engine.generate_batch(prompts, params | list[params]) -> list[GenerationResult]   # decoded together
    engine.stream(prompt, params) -> Iterator[StepEvent]
    engine.submit(prompt_ids, params, on_event) -> request id    # background scheduler thread
    engine.cancel(request_id); engine.close(); engine.drain(deadline)
    engine.on_step.append(fn)                            # fn(SpecDecodingStats) after every step

SamplingParams(max_new_tokens=128, temperature=0.0, top_k=0, top_p=1.0, seed=None, stop=(), end_id=None,
num_draft_tokens=None): temperature 0 is greedy; end_id None = the model's EOS, -1 = none; num_draft_tokens
None = the spec's K with adaptive control, 0 = plain decoding, n = fixed K (<= the spec's K). Invalid
requests raise trtspec.errors.GenerationError (from generate/stream/submit alike): temperature must be 0 or
finite >= 1e-5, top_k an integer >= 0, 0 < top_p <= 1, seed in [0, 2^64), end_id -1 or a token id, at most 16
stop strings of at most 256 characters. A request's output does not depend on what it is batched with: greedy, and
seeded sampling too (its random stream is its own), up to the rounding of batched matmuls (bf16 proposers
round a batch differently from one row).

Modules (as vLLM v1 splits a speculative engine):
  engine.py     the API and the model runner: prefill and the speculative step (one screen)
  request.py    one request: validation, its random stream, K, stop conditions, text, stats, events
  adaptive.py   adaptive K: the draft length that pays most, from acceptance and the measured costs
  costs.py      the cost table adaptive K prices with: verify seconds by rows, draft seconds by drafter
  scheduler.py  which requests run: queue, admission, background thread, cancel, drain
  proposer.py   the Proposer interface, Draft, chains/tries/trees; the proposers live with their methods
                (trtspec/methods/<name>.py, one module each: methods.get(spec.method).proposer(spec, device))
  rejection.py  the rejection sampler: greedy identity, min(1, p/q) + residual + bonus, trees, point masses
  sampling.py   SamplingParams and processed distributions (temperature, top-k, top-p)
  detok.py      tokens -> text and stop strings, for the engine and the served models alike
  stats.py      SpecDecodingStats per step, RequestStats per request, the one tokens-per-step definition
  threads.py    on_own_thread: load on a thread that ends (its OpenMP workers with it; methods.engine does)
  llama.py, cache.py  the model and its static KV cache / step masks

Names resolve lazily: detok and stats (no torch) serve the client and the served pre/postprocessing models,
which must not pay for importing torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "SpecEngine": "engine", "StepEvent": "request", "GenerationResult": "request",
    "AdaptiveConfig": "adaptive", "SamplingParams": "sampling", "Llama": "llama", "LlamaConfig": "llama",
    "Draft": "proposer", "DraftPlan": "proposer", "ProposalBatch": "proposer", "Proposer": "proposer",
    "SpecDecodingStats": "stats", "RequestStats": "stats",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'trtspec.runtime' has no attribute {name!r}")
    return getattr(importlib.import_module(f"trtspec.runtime.{module}"), name)
