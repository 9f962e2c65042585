"""Tiny random checkpoints in the layouts the converter reads (HF Llama, Medusa heads, EAGLE-1 head)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

VOCAB = 131          # not a multiple of 2 or 4: exercises lm_head padding
HIDDEN = 32
HEADS = 4
KV_HEADS = 2         # GQA; with tp=4 the KV heads are duplicated
LAYERS = 3           # pp=2 splits it 2 + 1
FFN = 64


def llama_config(**over):
    from transformers import LlamaConfig

    kw = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=256,
              rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
              bos_token_id=0, eos_token_id=0, pad_token_id=0)
    kw.update(over)
    return LlamaConfig(**kw)


def make_llama(out: Path, seed: int = 0, **over) -> Path:
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(**over))
    with torch.no_grad():  # non-trivial norms so a mixed-up layernorm is visible
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(str(out))
    return out


def make_medusa(out: Path, num_heads: int = 4, seed: int = 1) -> Path:
    from trtspec.artifacts.heads import write_medusa

    g = torch.Generator().manual_seed(seed)
    sd = {}
    for h in range(num_heads):
        sd[f"{h}.0.linear.weight"] = torch.randn(HIDDEN, HIDDEN, generator=g) * 0.1
        sd[f"{h}.0.linear.bias"] = torch.randn(HIDDEN, generator=g) * 0.1
        sd[f"{h}.1.weight"] = torch.randn(VOCAB, HIDDEN, generator=g) * 0.1
    write_medusa(out, sd, hidden_size=HIDDEN, vocab_size=VOCAB, num_layers=1)
    return out


def make_eagle(out: Path, seed: int = 2) -> Path:
    from trtspec.artifacts.heads import write_eagle

    g = torch.Generator().manual_seed(seed)
    hd = HIDDEN // HEADS
    r = lambda *s: torch.randn(*s, generator=g) * 0.1  # noqa: E731
    sd = {"fc.weight": r(HIDDEN, 2 * HIDDEN), "fc.bias": r(HIDDEN),
          "layers.0.self_attn.q_proj.weight": r(HEADS * hd, HIDDEN),
          "layers.0.self_attn.k_proj.weight": r(KV_HEADS * hd, HIDDEN),
          "layers.0.self_attn.v_proj.weight": r(KV_HEADS * hd, HIDDEN),
          "layers.0.self_attn.o_proj.weight": r(HIDDEN, HEADS * hd),
          "layers.0.mlp.gate_proj.weight": r(FFN, HIDDEN), "layers.0.mlp.up_proj.weight": r(FFN, HIDDEN),
          "layers.0.mlp.down_proj.weight": r(HIDDEN, FFN),
          "layers.0.post_attention_layernorm.weight": 1 + r(HIDDEN)}
    cfg = json.loads(llama_config(num_hidden_layers=1).to_json_string(use_diff=False))
    cfg.update(architectures=["LlamaForCausalLM"], bias=True)
    write_eagle(out, sd, cfg)
    return out


def write_spec(path: Path, body: str) -> Path:
    path.write_text("schema = 1\n" + body, encoding="utf-8")
    return path
