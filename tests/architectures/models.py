"""Tiny random checkpoints of every architecture the torch runtime runs, written by transformers itself.

Same scale as tests/runtime/family.py (vocab 96, hidden 64, GQA 4/2 heads of 16 dims, a large init so greedy
decisions have clear margins); norms (q/k norms too) at 1 + noise so the nets are not symmetric.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.runtime import family

BASE = dict(vocab_size=family.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
            rope_theta=10000.0, tie_word_embeddings=False, initializer_range=0.25, bos_token_id=0,
            eos_token_id=family.EOS, pad_token_id=None)
ROPE_FACTORS = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]  # longrope: one per rotary frequency (head_dim / 2)

# name -> (model_type, config overrides): every architecture and the options that change its maths.
CASES = {
    "llama-tied-bias": ("llama", dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True)),
    "llama-linear": ("llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "llama-dynamic": ("llama", dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0},
                                    max_position_embeddings=16)),
    "llama-llama3": ("llama", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "llama-yarn": ("llama", dict(rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 16})),
    "llama-longrope": ("llama", dict(max_position_embeddings=64, rope_scaling={
        "rope_type": "longrope", "short_factor": ROPE_FACTORS[::-1], "long_factor": ROPE_FACTORS,
        "original_max_position_embeddings": 16})),
    "mistral-window": ("mistral", dict(sliding_window=8)),
    "qwen2-tied": ("qwen2", dict(tie_word_embeddings=True)),
    "qwen2-window": ("qwen2", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    "qwen3": ("qwen3", dict()),
    "qwen3-bias-window": ("qwen3", dict(attention_bias=True, use_sliding_window=True, sliding_window=8,
                                        max_window_layers=1)),
}


def config(model_type: str, **kw):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **{**BASE, **kw})


def save(path: Path, model_type: str, seed: int, tokenizer: bool = True, **kw):
    """Write a random `model_type` checkpoint (and the tiny family's tokenizer) to `path`; returns the model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config(model_type, **kw)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    if tokenizer:
        family.save_tokenizer(path)
    return model
