"""Tiny EAGLE-3 fixtures: a 4-layer random target (so the three captured layers are distinct) and EAGLE-3 heads
written through the artifacts layout (random, with a reduced vocabulary), for tests/train and tests/methods."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.runtime import family


def save_target4(path: Path, seed: int = 31, **kw) -> Path:
    family.save_llama(path, seed=seed, num_hidden_layers=4, **kw)
    family.save_tokenizer(path, kw.get("vocab_size", family.VOCAB))
    return path


def save_eagle3(path: Path, target: Path, *, draft_vocab: int, seed: int = 5, scale: float = 0.3,
                aux: tuple[int, ...] | None = None, ffn: int = 96) -> Path:
    """A random EAGLE-3 head for `target` whose draft vocabulary is `draft_vocab` ids spread over the
    target's vocabulary (EOS always in)."""
    from trtspec.artifacts import heads as layouts
    from trtspec.artifacts.hf import ModelConfig

    t = ModelConfig.from_dir(target)
    H, V, nh, nkv, D = t.hidden_size, t.vocab_size, t.num_heads, t.num_kv_heads, t.head_dim
    g = torch.Generator().manual_seed(seed)
    used = torch.randperm(V, generator=g)[:draft_vocab]
    if t.eos_token_ids and not bool((used == t.eos_token_ids[0]).any()):
        used[0] = t.eos_token_ids[0]
    d2t, t2d = layouts.vocab_tensors(used, V)
    r = lambda *s: torch.randn(*s, generator=g) * scale  # noqa: E731
    m = "midlayer."
    w = {"fc.weight": r(H, 3 * H), m + "input_layernorm.weight": 1 + r(H), m + "hidden_norm.weight": 1 + r(H),
         m + "self_attn.q_proj.weight": r(nh * D, 2 * H), m + "self_attn.k_proj.weight": r(nkv * D, 2 * H),
         m + "self_attn.v_proj.weight": r(nkv * D, 2 * H), m + "self_attn.o_proj.weight": r(H, nh * D),
         m + "post_attention_layernorm.weight": 1 + r(H), m + "mlp.gate_proj.weight": r(ffn, H),
         m + "mlp.up_proj.weight": r(ffn, H), m + "mlp.down_proj.weight": r(H, ffn), "norm.weight": 1 + r(H),
         "lm_head.weight": r(len(d2t), H) * 4, "d2t": d2t, "t2d": t2d}
    layer = {"hidden_size": H, "intermediate_size": ffn, "num_attention_heads": nh, "num_key_value_heads": nkv,
             "head_dim": D, "rms_norm_eps": t.rms_norm_eps, "rope_theta": t.rope_theta,
             "max_position_embeddings": t.max_position_embeddings}
    raw = layouts.eagle3_raw_config(layer, vocab_size=V, draft_vocab_size=len(d2t), target_hidden_size=H,
                                    aux_layers=aux or layouts.default_aux_layers(t.num_layers))
    layouts.write_eagle3(path, w, raw)
    return path


def write_spec(root: Path, target: Path, heads: Path, *, k: int = 4, choices=None, batch: int = 4,
               name: str = "eagle3") -> Path:
    lines = ["schema = 1", "[model]", f'name = "{name}"', f'target = "{target}"', 'dtype = "float32"',
             "[speculative]", 'method = "eagle"', f'heads = "{heads}"', f"num_draft_tokens = {k}"]
    if choices is not None:
        lines.append(f"choices = {json.dumps(choices)}")
    lines += ["[speculative.adaptive]", "enabled = false", "[limits]", f"max_batch_size = {batch}",
              "max_input_len = 64", "max_output_len = 64", "[runtime]", 'kind = "torch"', 'device = "cpu"']
    path = root / f"{name}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_prompts(path: Path, n: int = 30, seed: int = 3) -> Path:
    """A JSONL prompt set of `n` random 6-word prompts over the tiny vocabulary (the trainers' --data)."""
    g = torch.Generator().manual_seed(seed)
    path.write_text("".join(json.dumps({"prompt": " ".join(f"w{int(i)}"
                                                           for i in torch.randint(1, 90, (6,), generator=g))})
                            + "\n" for _ in range(n)))
    return path
