"""Trainable modules: transformers' Llama as the language model, Medusa and EAGLE-1 heads in the layouts of
trtspec.artifacts.heads (whose docstring has their equations); their losses are the drafter trainer's
(train/losses.py).

Notation (one sequence, positions t = 0..T-1): x_t token ids, E = target.model.embed_tokens.weight [V, H],
L = target.lm_head.weight [V, H], f_t the target's final hidden state AFTER the final RMSNorm (the input of
lm_head: logits_t = L f_t predicts x_{t+1}).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trtspec.artifacts.hf import ModelConfig
from trtspec.train.data import VOCAB_SIZE


@dataclass(frozen=True)
class Shape:
    """The few numbers a demo Llama is made of (recorded in the family's MANIFEST as they are)."""

    n_layer: int
    dim: int
    n_head: int
    n_kv_head: int
    ffn: int
    vocab: int = VOCAB_SIZE
    max_pos: int = 1024
    rope_theta: float = 10000.0
    eps: float = 1e-5

    def model_config(self, dtype: str | None = None) -> ModelConfig:
        """A Llama of this shape, untied, without biases; token 0 is bos, eos and pad."""
        return ModelConfig(
            model_type="llama", architectures=("LlamaForCausalLM",), vocab_size=self.vocab, hidden_size=self.dim,
            intermediate_size=self.ffn, num_layers=self.n_layer, num_heads=self.n_head, num_kv_heads=self.n_kv_head,
            head_dim=self.dim // self.n_head, rms_norm_eps=self.eps, rope_theta=self.rope_theta,
            max_position_embeddings=self.max_pos, eos_token_ids=(0,), bos_token_id=0, torch_dtype=dtype)

    def hf_config(self, dtype: str | None = None):
        """The transformers LlamaConfig the trainer instantiates (init std 0.02)."""
        cfg = self.model_config(dtype).to_hf()
        cfg.pad_token_id, cfg.initializer_range = 0, 0.02
        return cfg


def llama(shape: Shape):
    """A freshly initialised transformers LlamaForCausalLM (normal(0, 0.02) weights, unit norms)."""
    from transformers import LlamaForCausalLM

    cfg = shape.hf_config()
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def forward(model, ids: Tensor) -> tuple[Tensor, Tensor]:
    """(logits [B, T, V], f [B, T, H]) of a LlamaForCausalLM; f is the final post-norm hidden state."""
    f = model.model(input_ids=ids, use_cache=False).last_hidden_state
    return model.lm_head(f), f


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


class VocabMedusa(nn.Module):
    """Medusa heads trained over a draft vocabulary (`trtspec train medusa`): head h's logits over it are
    lm_h (f + silu(W_h f + b_h)), lm_h [Vd, H] initialised from the target's lm_head rows; the full layout's
    lm head is the target's with those rows replaced (layout_tensors)."""

    def __init__(self, dim: int, lm_rows: Tensor, n_heads: int = 4):
        super().__init__()
        self.res = nn.ModuleList(nn.Linear(dim, dim) for _ in range(n_heads))
        for lin in self.res:
            nn.init.zeros_(lin.weight)  # start as the identity map: x = f + silu(b)
            nn.init.zeros_(lin.bias)
        self.lm = nn.Parameter(lm_rows.detach().float().clone()[None].repeat(n_heads, 1, 1))

    @property
    def num_heads(self) -> int:
        return len(self.res)

    def logits(self, h: int, f: Tensor) -> Tensor:
        """f [..., H] -> head h's logits over the draft vocabulary [..., Vd]."""
        return (f + F.silu(self.res[h](f))) @ self.lm[h].T

    def layout_tensors(self, lm_head: Tensor, used: Tensor) -> dict[str, Tensor]:
        """The Medusa layout (artifacts.heads.write_medusa): lm_head [V, H] with rows `used` trained."""
        sd = {}
        for h, lin in enumerate(self.res):
            full = lm_head.detach().float().clone()
            full[used] = self.lm[h].detach().to(full.device)
            sd[f"{h}.0.linear.weight"], sd[f"{h}.0.linear.bias"] = lin.weight.detach(), lin.bias.detach()
            sd[f"{h}.1.weight"] = full
        return sd


class EagleHead(nn.Module):
    """EAGLE-1: f^_{t+1} = Layer(fc(cat([E[x_{t+1}], f_t]))), transformers' LlamaDecoderLayer without its
    input norm, with the target's RoPE; causal attention over positions 0..T-1. `shape`: a demo Shape, or
    the one-layer ModelConfig of a user's target (`trtspec train eagle`)."""

    def __init__(self, shape: Shape | ModelConfig):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        if isinstance(shape, Shape):
            self.config, dim = replace(shape, n_layer=1).hf_config(), shape.dim
        else:
            self.config, dim = replace(shape, num_layers=1).to_hf(), shape.hidden_size
        self.config._attn_implementation = "sdpa"  # causal without a mask (eager would attend everywhere)
        self.fc = nn.Linear(2 * dim, dim, bias=True)
        layer = LlamaDecoderLayer(self.config, layer_idx=0)
        layer.input_layernorm = nn.Identity()
        self.layers = nn.ModuleList([layer])
        self.rotary = LlamaRotaryEmbedding(self.config)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, next_emb: Tensor, feats: Tensor) -> Tensor:
        """next_emb [B, T, H] = E[x_{t+1}], feats [B, T, H] = f_t  ->  f^_{t+1} [B, T, H]."""
        x = self.fc(torch.cat([next_emb, feats], dim=-1))
        positions = torch.arange(x.shape[1], device=x.device)[None]
        rope = self.rotary(x, positions)
        for layer in self.layers:
            x = layer(x, position_ids=positions, position_embeddings=rope)
        return x


# ------------------------------------------------------------------------------------------ the LM loss


def lm_loss(logits: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    """Next-token cross-entropy; logits [B, T, V], labels [B, T]."""
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction=reduction)
