"""The trainable EAGLE-3 head and its training-time-test (TTT) loss, as SpecForge and the EAGLE repo train it
(arXiv 2503.01840; the equations and the layout: trtspec/artifacts/heads.py, "EAGLE-3").

Parameters carry the layout's names (`fc`, `midlayer.*`, `norm`, `lm_head`), so `layout_tensors()` is the
checkpoint (plus `d2t`/`t2d`); the target's embedding is a frozen buffer, not saved (vLLM and TensorRT-LLM
share the target's). RoPE is the runtime's own (`runtime.llama.rope_tables`), so training and serving rotate
alike.

TTT (SpecForge `algorithms/eagle3/model.py`, `length` steps; EA `traineagle3/cnets.py`): step 0 runs the
layer over every position t with (x_{t+1}, a_t = fc(g_t)); step k feeds at position t the token x_{t+1+k}
and the head's own step-(k-1) output o_t (no fc), RoPE position t + k, and attends to the step-0 keys at
positions <= t plus its own chain's keys of steps 1..k (the keys that serving's cache holds when it drafts
the (k+1)-th token after position t). Step k at t predicts x_{t+2+k}; its loss is the soft cross-entropy
against the target's distribution at t+1+k restricted to the draft vocabulary (positions whose target argmax
lies outside the draft vocabulary are left out, as SpecForge's position_mask), weighted 0.8^k.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trtspec.artifacts.heads import vocab_tensors
from trtspec.artifacts.hf import ModelConfig
from trtspec.runtime.llama import apply_rope, rope_tables

DECAY = 0.8  # SpecForge ploss_decay, EA main.py ploss_weight = 0.8 ** i


class _Norm(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))


class _Attn(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        H = c.hidden_size
        self.q_proj = nn.Linear(2 * H, c.q_size, bias=False)
        self.k_proj = nn.Linear(2 * H, c.kv_size, bias=False)
        self.v_proj = nn.Linear(2 * H, c.kv_size, bias=False)
        self.o_proj = nn.Linear(c.q_size, H, bias=False)


class _Mlp(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)


class _Midlayer(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.input_layernorm, self.hidden_norm = _Norm(c.hidden_size), _Norm(c.hidden_size)
        self.self_attn, self.post_attention_layernorm, self.mlp = _Attn(c), _Norm(c.hidden_size), _Mlp(c)


class Eagle3Head(nn.Module):
    """fc (3 Ht -> H), one decoder layer over [input_layernorm(E[x]); hidden_norm(a)], final norm, lm_head
    over the draft vocabulary; `embed` (the target's [V, H]) is frozen."""

    def __init__(self, layer: ModelConfig, target_hidden: int, draft_vocab: Tensor, embed: Tensor,
                 max_positions: int = 4096):
        super().__init__()
        self.c = layer
        H = layer.hidden_size
        self.fc = nn.Linear(3 * target_hidden, H, bias=False)
        self.midlayer = _Midlayer(layer)
        self.norm = _Norm(H)
        d2t, t2d = vocab_tensors(draft_vocab, layer.vocab_size)
        self.lm_head = nn.Linear(H, len(d2t), bias=False)
        self.register_buffer("d2t", d2t, persistent=False)
        self.register_buffer("t2d", t2d, persistent=False)
        self.register_buffer("ids", d2t + torch.arange(len(d2t)), persistent=False)  # draft id -> target id
        self.register_buffer("embed", embed.detach().float().clone(), persistent=False)
        cos, sin = rope_tables(layer, max_positions)
        self.register_buffer("rope", torch.cat([cos, sin], -1), persistent=False)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)

    @property
    def draft_vocab_size(self) -> int:
        return self.lm_head.out_features

    def layout_tensors(self) -> dict[str, Tensor]:
        """The checkpoint's tensors (artifacts.heads.write_eagle3)."""
        return {**{k: v.detach() for k, v in self.state_dict().items()}, "d2t": self.d2t, "t2d": self.t2d}

    def load_layout(self, w: dict[str, Tensor]) -> None:
        self.load_state_dict({k: v.float() for k, v in w.items() if k not in ("d2t", "t2d")})

    def _norm(self, x: Tensor, n: _Norm) -> Tensor:
        return F.rms_norm(x, (self.c.hidden_size,), n.weight, self.c.rms_norm_eps)

    def logits(self, out: Tensor) -> Tensor:
        """Draft-vocabulary logits of layer outputs o [.., H]."""
        return self.lm_head(self._norm(out, self.norm))

    def ttt(self, step_tokens: list[Tensor], feats: Tensor) -> list[Tensor]:
        """The unrolled steps. step_tokens[k] [B, T]: the token fed at position t in step k (x_{t+1+k} in
        training); feats [B, T, 3Ht]: the target's captured layers. Returns the layer outputs o [B, T, H] per
        step (logits: `self.logits`)."""
        c, mid = self.c, self.midlayer
        nh, nkv, D = c.num_heads, c.num_kv_heads, c.head_dim
        B, T = step_tokens[0].shape
        hidden = self.fc(feats)
        keys: list[Tensor] = []
        values: list[Tensor] = []
        causal = torch.ones(T, T, dtype=torch.bool, device=feats.device).tril()
        outs = []

        for k, tokens in enumerate(step_tokens):
            e = self._norm(F.embedding(tokens, self.embed), mid.input_layernorm)
            x = torch.cat([e, self._norm(hidden, mid.hidden_norm)], -1)
            a = mid.self_attn
            q = a.q_proj(x).view(B, T, nh, D)
            kk = a.k_proj(x).view(B, T, nkv, D)
            v = a.v_proj(x).view(B, T, nkv, D)
            cos, sin = self.rope[k: k + T].unsqueeze(1).chunk(2, dim=-1)  # positions t + k
            q, kk = apply_rope(q, cos, sin), apply_rope(kk, cos, sin)
            q, kk, v = q.transpose(1, 2), kk.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, D]
            rep = nh // nkv
            kk, v = kk.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            keys.append(kk)
            values.append(v)
            scale = 1.0 / math.sqrt(D)
            s0 = (q @ keys[0].transpose(-1, -2)) * scale
            s0 = s0.masked_fill(~causal, float("-inf"))
            diag = [(q * kj).sum(-1, keepdim=True) * scale for kj in keys[1:]]  # own chain: steps 1..k
            w = torch.softmax(torch.cat([s0, *diag], -1).float(), -1).to(q.dtype)
            o = w[..., :T] @ values[0]
            for j, vj in enumerate(values[1:]):
                o = o + w[..., T + j: T + j + 1] * vj
            out = hidden + a.o_proj(o.transpose(1, 2).reshape(B, T, nh * D))
            m = mid.mlp
            h = self._norm(out, mid.post_attention_layernorm)
            out = out + m.down_proj(F.silu(m.gate_proj(h)) * m.up_proj(h))
            outs.append(out)
            hidden = out
        return outs


def shifted(ids: Tensor, k: int) -> Tensor:
    """ids [B, T] -> the tokens step k feeds: x_{t+1+k} at t (0 past the end; those positions carry no loss)."""
    return F.pad(ids[:, 1 + k:], (0, 1 + k))


def ttt_loss(head: Eagle3Head, ids: Tensor, feats: Tensor, top_ids: Tensor, top_logits: Tensor, mask: Tensor,
             steps: int, decay: float = DECAY) -> tuple[Tensor, list[float], list[float]]:
    """The TTT loss of a batch: ids [B, T], feats [B, T, 3Ht], the target's top-k over the draft vocabulary at
    each position (top_ids [B, T, k] draft ids, top_logits [B, T, k]), mask [B, T] (True: the token the
    target predicts at t, x_{t+1}, is trained on, and the target's argmax at t is in the draft vocabulary).
    Returns (loss, per-step losses, per-step top-1 agreement with the teacher's argmax)."""
    T = ids.shape[1]
    outs = head.ttt([shifted(ids, k) for k in range(steps)], feats)
    total = feats.new_zeros(())
    losses, accs = [], []
    for k, out in enumerate(outs):
        n = T - 1 - k
        if n <= 0:
            break
        logq = torch.log_softmax(head.logits(out[:, :n]).float(), -1)
        p = torch.softmax(top_logits[:, 1 + k:].float(), -1)
        m = mask[:, 1 + k:].float()
        ce = -(p * logq.gather(-1, top_ids[:, 1 + k:].long())).sum(-1)
        denom = m.sum().clamp(min=1.0)
        loss = (ce * m).sum() / denom
        acc = ((logq.argmax(-1) == top_ids[:, 1 + k:, 0].long()).float() * m).sum() / denom
        total = total + (decay ** k) * loss
        losses.append(float(loss.detach()))
        accs.append(float(acc))
    return total, losses, accs


@torch.no_grad()
def reference_chain(head: Eagle3Head, seq: list[int], feats: Tensor, k: int) -> list[int]:
    """The greedy chain a served head proposes after `seq` (its last token pending), recomputed from scratch
    with the training module: feats [len(seq) - 1, 3Ht] are the target's features at positions
    0..len(seq)-2, so the real entries are (seq[t+1], fc(g_t)); each step is TTT's next step at the last
    position fed its own previous draft. Returns target ids."""
    ids = torch.tensor([seq[1:]])
    n = ids.shape[1]
    steps, out = [ids], []
    for d in range(k):
        o = head.ttt(steps, feats[None].float())[-1]
        tok = int(head.ids[head.logits(o[0, n - 1]).argmax()])
        out.append(tok)
        nxt = torch.zeros_like(ids)
        nxt[0, n - 1] = tok  # only the last position's chain is read
        steps.append(nxt)
    return out
