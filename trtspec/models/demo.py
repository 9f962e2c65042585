"""The shipped demo model family: a small Llama target and three drafters, trained on the
Python standard library in 40-50 minutes on two CPU cores (fixed steps, seed 0).

Everything here is plain PyTorch: a ~60-line Llama whose parameter names match
`transformers.LlamaForCausalLM`, one training loop, one teacher pass, and a tiny greedy
speculative loop that measures acceptance. `trtspec models train-demo` drives `train_family`.

Layout written by `train_family(out)`::

    out/
      MANIFEST.json        sha256 + size of every file, seeds, steps, losses, acceptance
      target/              LlamaForCausalLM (config.json, model.safetensors, generation_config.json,
                           tokenizer.json, tokenizer_config.json, special_tokens_map.json)
      draft/               a small LlamaForCausalLM distilled from the target, same tokenizer files
      medusa/              medusa_lm_head.safetensors + config.json  (TensorRT-LLM Medusa layout)
      eagle/               model.safetensors + config.json           (EAGLE-1 layout)

All weights are stored in float16. Tokenizer: byte-level BPE, vocab 2048, one special token
`<|endoftext|>` (id 0) serving as bos/eos/pad; no token is added on encode, and
`decode(encode(s)) == s` for any text.

Notation used below (all tensors of one sequence, positions t = 0..T-1)::

    x_t         token id at position t
    E           target.model.embed_tokens.weight  [V, H]
    L           target.lm_head.weight             [V, H]
    f_t         the target's final hidden state at t, AFTER the final RMSNorm (model.norm),
                i.e. exactly the input of lm_head:  target logits_t = L f_t  (predicts x_{t+1})
    silu(z)     z * sigmoid(z)

Medusa heads (`medusa/`, h = 0..3, one ResBlock layer each; keys in medusa_lm_head.safetensors)::

    W_h = "{h}.0.linear.weight" [H, H]    b_h = "{h}.0.linear.bias" [H]    L_h = "{h}.1.weight" [V, H]
    u_h(t)      = f_t + silu(W_h f_t + b_h)
    logits_h(t) = L_h u_h(t)                               (no bias, no extra norm)
    head h at position t predicts x_{t+2+h}; the target's own lm_head predicts x_{t+1}.
    So after the target has produced f_t and the next token x_{t+1} = argmax L f_t, the
    greedy Medusa chain candidate is [x_{t+1}, argmax logits_0(t), ..., argmax logits_3(t)].

EAGLE-1 head (`eagle/model.safetensors`; it has NO embed_tokens, NO lm_head, NO final norm
and NO input_layernorm: it reuses the target's E and L)::

    fc: weight "fc.weight" [H, 2H], bias "fc.bias" [H]
    layer 0: "layers.0.self_attn.{q,k,v,o}_proj.weight", "layers.0.mlp.{gate,up,down}_proj.weight",
             "layers.0.post_attention_layernorm.weight" (same shapes as a target layer)

    input at position t (t = 0..n-1):   g_t = f_t for verified positions, else the head's own
                                        earlier output f^_t (see chain drafting below)
        e_t = E[x_{t+1}]                                   embedding of the NEXT token
        z_t = fc.weight @ cat([e_t, g_t]) + fc.bias         (embedding first, feature second)
    one Llama decoder layer over z_0..z_{n-1}, without the input norm:
        a   = z + o_proj(Attn(q_proj z, k_proj z, v_proj z))      causal self-attention over
              positions 0..t, RoPE at positions t (same theta, head_dim, GQA grouping and
              1/sqrt(head_dim) scale as the target; rotate-half RoPE as in transformers' Llama)
        f^  = a + down_proj(silu(gate_proj r) * up_proj r),   r = RMSNorm_post(a)  (eps = target's)
    f^_{t+1} := output at position t; it estimates f_{t+1}; logits = L f^_{t+1} predicts x_{t+2}.

    Chain drafting (greedy, K tokens) after the target verified x_0..x_t and gave the next token
    x_{t+1}: run the head on positions 0..t (inputs f_0..f_t and x_1..x_{t+1}) to get f^_{t+1}
    and d_1 = argmax L f^_{t+1} (= x_{t+2} guess); then for j = 1..K-1 append position t+j with
    inputs (f^_{t+j}, d_j), giving f^_{t+j+1} and d_{j+1}. The candidate verified by the target
    is [x_{t+1}, d_1, ..., d_K]. (A KV cache over positions gives the same result.)

Training recipe (see train_family): the target is trained on next-token CE; one frozen-target
pass over a fixed training subset stores f_t and the top-k logits; the draft learns KL to the
top-k plus a little CE; Medusa head h learns the teacher's top-k at position t+1+h (self-
distillation); EAGLE learns smooth-L1(f^_{t+1}, f_{t+1}) + 0.1 * CE(L f^_{t+1}, teacher top-k).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from trtspec.errors import ModelError

EOT = "<|endoftext|>"
VOCAB_SIZE = 2048
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
DEFAULT_MODELS_DIR = Path(__file__).resolve().parents[2] / "examples" / "models"
HELDOUT_EVERY = 25  # file i (in sorted order) is held out when i % 25 == HELDOUT_OFFSET  (4 %)
HELDOUT_OFFSET = 12
EXCLUDED_DIRS = ("site-packages", "dist-packages", "encodings", "pydoc_data", "__pycache__")

# A step callback: (phase, step, total_steps, loss or None). The CLI turns it into progress bars.
Reporter = Callable[[str, int, int, "float | None"], None]


def _silent(phase: str, step: int, total: int, loss: float | None) -> None:
    pass


# --------------------------------------------------------------------------------------------
# Corpus and tokenizer
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    root: Path
    train_files: tuple[str, ...]  # paths relative to root, posix, sorted
    heldout_files: tuple[str, ...]

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8")


def _is_test_path(rel: str) -> bool:
    parts = rel.split("/")
    return any(p in ("test", "tests") or p.startswith(("test_", "idle_test")) for p in parts[:-1])


def stdlib_corpus(root: Path | None = None, max_files: int | None = None,
                  max_file_bytes: int | None = None) -> Corpus:
    """The interpreter's stdlib *.py, tests and data-only packages excluded, split by file.

    Files are sorted by relative path; file i is held out when i % 25 == 12 (about 4 %).
    `max_files` keeps an evenly spaced subset (quick mode), `max_file_bytes` skips big files.
    """
    root = Path(root or sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise ModelError(f"Python stdlib not found at {root}", hint="run with a regular CPython install")
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if _is_test_path(rel) or any(p in EXCLUDED_DIRS for p in rel.split("/")[:-1]):
            continue
        if max_file_bytes and path.stat().st_size > max_file_bytes:
            continue
        try:
            path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        files.append(rel)
    files.sort()
    if max_files and len(files) > max_files:
        stride = len(files) / max_files
        files = [files[int(i * stride)] for i in range(max_files)]
    if len(files) < HELDOUT_EVERY:
        raise ModelError(f"only {len(files)} usable .py files under {root}", hint="need at least 25")
    held = tuple(f for i, f in enumerate(files) if i % HELDOUT_EVERY == HELDOUT_OFFSET)
    train = tuple(f for i, f in enumerate(files) if i % HELDOUT_EVERY != HELDOUT_OFFSET)
    return Corpus(root, train, held)


def train_tokenizer(texts: Sequence[str], vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE (GPT-2 pre-tokenizer, no prefix space) with `<|endoftext|>` as id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def save_tokenizer(tok, out: Path) -> None:
    """Save in HF format (tokenizer.json, tokenizer_config.json, special_tokens_map.json)."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOT, eos_token=EOT, pad_token=EOT,
        clean_up_tokenization_spaces=False, model_max_length=1024,
    )
    fast.save_pretrained(str(out))
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"  # readable by transformers 4.x and 5.x
    cfg["add_bos_token"] = False
    cfg["add_eos_token"] = False
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    special = {"bos_token": EOT, "eos_token": EOT, "pad_token": EOT, "unk_token": EOT}
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def encode_files(tok, texts: Sequence[str]) -> Tensor:
    """One int64 stream: each file's tokens followed by `<|endoftext|>`."""
    eot = tok.token_to_id(EOT)
    out: list[int] = []
    for enc in tok.encode_batch(list(texts)):
        out.extend(enc.ids)
        out.append(eot)
    return torch.tensor(out, dtype=torch.long)


# --------------------------------------------------------------------------------------------
# A compact Llama with transformers' LlamaForCausalLM parameter names
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaShape:
    n_layer: int
    dim: int
    n_head: int
    n_kv_head: int
    ffn: int
    vocab: int = VOCAB_SIZE
    max_pos: int = 1024
    rope_theta: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    def hf_config(self, **extra):
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=self.vocab, hidden_size=self.dim, intermediate_size=self.ffn,
            num_hidden_layers=self.n_layer, num_attention_heads=self.n_head,
            num_key_value_heads=self.n_kv_head, max_position_embeddings=self.max_pos,
            rms_norm_eps=self.eps, rope_theta=self.rope_theta, tie_word_embeddings=False,
            hidden_act="silu", attention_bias=False, mlp_bias=False,
            bos_token_id=0, eos_token_id=0, pad_token_id=0, **extra,
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)


def rope(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], dim=-1) * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.s = s
        self.q_proj = nn.Linear(s.dim, s.n_head * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.dim, s.n_kv_head * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.dim, s.n_kv_head * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.n_head * s.head_dim, s.dim, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        B, T, _ = x.shape
        s = self.s
        q = self.q_proj(x).view(B, T, s.n_head, s.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, s.n_kv_head, s.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, s.n_kv_head, s.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if s.n_kv_head != s.n_head:  # GQA: query head i reads kv head i // (n_head / n_kv_head)
            k = k.repeat_interleave(s.n_head // s.n_kv_head, dim=1)
            v = v.repeat_interleave(s.n_head // s.n_kv_head, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, s.n_head * s.head_dim))


class MLP(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.dim, s.ffn, bias=False)
        self.up_proj = nn.Linear(s.dim, s.ffn, bias=False)
        self.down_proj = nn.Linear(s.ffn, s.dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, s: LlamaShape, input_norm: bool = True):
        super().__init__()
        self.input_layernorm = RMSNorm(s.dim, s.eps) if input_norm else nn.Identity()
        self.self_attn = Attention(s)
        self.post_attention_layernorm = RMSNorm(s.dim, s.eps)
        self.mlp = MLP(s)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab, s.dim)
        self.layers = nn.ModuleList(Block(s) for _ in range(s.n_layer))
        self.norm = RMSNorm(s.dim, s.eps)


class Llama(nn.Module):
    """`forward(ids) -> (logits, f)` where f is the final post-norm hidden state."""

    def __init__(self, s: LlamaShape):
        super().__init__()
        self.s = s
        self.model = LlamaModel(s)
        self.lm_head = nn.Linear(s.dim, s.vocab, bias=False)
        self.apply(_init_weights)

    def forward(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = rope(torch.arange(ids.shape[1]), self.s.head_dim, self.s.rope_theta)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        f = self.model.norm(x)
        return self.lm_head(f), f


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, (nn.Linear, nn.Embedding)):
        nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


class MedusaHeads(nn.Module):
    """Head h: logits_h = L_h (f + silu(W_h f + b_h)); predicts the token 2 + h positions ahead."""

    def __init__(self, dim: int, vocab: int, n_heads: int = 4):
        super().__init__()
        self.heads = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, dim), nn.Linear(dim, vocab, bias=False)) for _ in range(n_heads)
        )
        for head in self.heads:
            nn.init.zeros_(head[0].weight)  # start as the identity map: x = f + silu(b)

    def forward(self, f: Tensor) -> Tensor:
        """f [..., H] -> logits [n_heads, ..., V]."""
        return torch.stack([head[1](f + F.silu(head[0](f))) for head in self.heads])

    def trtllm_state_dict(self) -> dict[str, Tensor]:
        sd = {}
        for h, head in enumerate(self.heads):
            sd[f"{h}.0.linear.weight"] = head[0].weight
            sd[f"{h}.0.linear.bias"] = head[0].bias
            sd[f"{h}.1.weight"] = head[1].weight
        return sd


class EagleHead(nn.Module):
    """EAGLE-1: f^_{t+1} = Layer(fc(cat([E[x_{t+1}], f_t]))), a decoder layer without input norm."""

    def __init__(self, s: LlamaShape):
        super().__init__()
        self.s = replace(s, n_layer=1)
        self.fc = nn.Linear(2 * s.dim, s.dim, bias=True)
        self.layers = nn.ModuleList([Block(self.s, input_norm=False)])
        self.apply(_init_weights)

    def forward(self, next_emb: Tensor, feats: Tensor) -> Tensor:
        """next_emb [B, T, H] = E[x_{t+1}], feats [B, T, H] = f_t  ->  f^_{t+1} [B, T, H]."""
        cos, sin = rope(torch.arange(feats.shape[1]), self.s.head_dim, self.s.rope_theta)
        x = self.fc(torch.cat([next_emb, feats], dim=-1))
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    steps: int
    batch: int
    lr: float
    warmup: int = 50
    weight_decay: float = 0.1


@dataclass(frozen=True)
class FamilyConfig:
    seed: int = 0
    seq_len: int = 256
    target: LlamaShape = LlamaShape(n_layer=6, dim=512, n_head=8, n_kv_head=4, ffn=1408)
    draft: LlamaShape = LlamaShape(n_layer=2, dim=192, n_head=6, n_kv_head=2, ffn=512)
    target_stage: Stage = Stage(steps=1050, batch=16, lr=1.5e-3, warmup=60)
    draft_stage: Stage = Stage(steps=2000, batch=16, lr=3e-3)
    medusa_stage: Stage = Stage(steps=500, batch=16, lr=1e-3, weight_decay=0.0)
    eagle_stage: Stage = Stage(steps=1000, batch=16, lr=1e-3, weight_decay=0.0)
    teacher_seqs: int = 4096     # sequences of seq_len in the frozen-target pass
    topk: int = 16
    eval_seqs: int = 48          # seq_len windows for train / held-out loss
    accept_prompts: int = 16
    accept_prompt_tokens: int = 64
    accept_new_tokens: int = 64
    max_files: int | None = None
    max_file_bytes: int | None = None
    threads: int = 2
    quick: bool = False

    @classmethod
    def quick_config(cls, seed: int = 0) -> FamilyConfig:
        """A few-second run for tests: tiny models, a corpus subset, a handful of steps."""
        return cls(
            seed=seed, seq_len=64,
            target=LlamaShape(n_layer=2, dim=64, n_head=4, n_kv_head=2, ffn=128, max_pos=256),
            draft=LlamaShape(n_layer=1, dim=32, n_head=2, n_kv_head=1, ffn=64, max_pos=256),
            target_stage=Stage(steps=6, batch=8, lr=3e-3, warmup=2),
            draft_stage=Stage(steps=4, batch=8, lr=3e-3, warmup=2),
            medusa_stage=Stage(steps=3, batch=8, lr=1e-3, warmup=1, weight_decay=0.0),
            eagle_stage=Stage(steps=3, batch=8, lr=1e-3, warmup=1, weight_decay=0.0),
            teacher_seqs=16, topk=8, eval_seqs=4, accept_prompts=2, accept_prompt_tokens=16,
            accept_new_tokens=8, max_files=50, max_file_bytes=12_000, quick=True,
        )


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def _lr_at(stage: Stage, step: int) -> float:
    if step < stage.warmup:
        return stage.lr * (step + 1) / stage.warmup
    progress = (step - stage.warmup) / max(1, stage.steps - stage.warmup)
    return stage.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def _optimizer(params: list[nn.Parameter], stage: Stage) -> torch.optim.AdamW:
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": stage.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=stage.lr, betas=(0.9, 0.95), eps=1e-8)


def _fit(phase: str, params: list[nn.Parameter], stage: Stage, loss_fn: Callable[[int], Tensor],
         report: Reporter) -> tuple[float, float]:
    """Shared loop: AdamW, warmup + cosine to 10 %, grad-clip 1, bf16 autocast.
    loss_fn(step) builds its own batch. Returns (mean loss of the last 10 % of steps, wall s)."""
    opt = _optimizer(params, stage)
    tail: list[float] = []
    t0 = time.perf_counter()
    for step in range(stage.steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(stage, step)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        value = loss.item()
        if step >= stage.steps - max(1, stage.steps // 10):
            tail.append(value)
        report(phase, step + 1, stage.steps, value)
    return sum(tail) / len(tail), time.perf_counter() - t0


def _windows(stream: Tensor, starts: Tensor, length: int) -> Tensor:
    return torch.stack([stream[s: s + length] for s in starts.tolist()])


def train_lm(model: Llama, stream: Tensor, stage: Stage, seq_len: int, gen: torch.Generator,
             report: Reporter, phase: str = "target") -> tuple[float, float]:
    """Next-token cross-entropy on random seq_len windows of the token stream."""

    def loss_fn(step: int) -> Tensor:
        starts = torch.randint(0, len(stream) - seq_len - 1, (stage.batch,), generator=gen)
        batch = _windows(stream, starts, seq_len + 1)
        logits, _ = model(batch[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())

    model.train()
    return _fit(phase, list(model.parameters()), stage, loss_fn, report)


@dataclass
class TeacherPass:
    """The frozen target's outputs on a fixed training subset (computed once).

    ids [N, T+1] (position T is only a label), feats [N, T, H] fp16 = f_t,
    top_logits / top_ids [N, T, k] = the target's top-k logits at each position (predicting t+1)."""

    ids: Tensor
    feats: Tensor
    top_logits: Tensor
    top_ids: Tensor
    wall_s: float = 0.0


@torch.no_grad()
def teacher_pass(target: Llama, stream: Tensor, n_seqs: int, seq_len: int, k: int,
                 gen: torch.Generator, report: Reporter, chunk: int = 16) -> TeacherPass:
    t0 = time.perf_counter()
    n_slots = (len(stream) - 1) // (seq_len + 1)
    n_seqs = min(n_seqs, n_slots)
    slots = torch.randperm(n_slots, generator=gen)[:n_seqs].sort().values
    ids = _windows(stream, slots * (seq_len + 1), seq_len + 1)
    feats = torch.empty(n_seqs, seq_len, target.s.dim, dtype=torch.float16)
    top_logits = torch.empty(n_seqs, seq_len, k, dtype=torch.float16)
    top_ids = torch.empty(n_seqs, seq_len, k, dtype=torch.int16)
    target.eval()
    for i in range(0, n_seqs, chunk):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, f = target(ids[i: i + chunk, :-1])
        vals, idx = logits.float().topk(k, dim=-1)
        feats[i: i + chunk] = f.to(torch.float16)
        top_logits[i: i + chunk] = vals.to(torch.float16)
        top_ids[i: i + chunk] = idx.to(torch.int16)
        report("teacher", min(i + chunk, n_seqs), n_seqs, None)
    return TeacherPass(ids, feats, top_logits, top_ids, time.perf_counter() - t0)


def soft_ce(logits: Tensor, top_logits: Tensor, top_ids: Tensor) -> Tensor:
    """Cross-entropy of the student against the teacher's renormalised top-k distribution
    (= KL up to the teacher's entropy)."""
    p = torch.softmax(top_logits.float(), dim=-1)
    logq = torch.log_softmax(logits.float(), dim=-1).gather(-1, top_ids.long())
    return -(p * logq).sum(-1).mean()


def train_draft(draft: Llama, tp: TeacherPass, stage: Stage, gen: torch.Generator, report: Reporter,
                ce_weight: float = 0.1) -> tuple[float, float]:
    def loss_fn(step: int) -> Tensor:
        rows = torch.randint(0, len(tp.ids), (stage.batch,), generator=gen)
        ids = tp.ids[rows]
        logits, _ = draft(ids[:, :-1])
        kd = soft_ce(logits, tp.top_logits[rows], tp.top_ids[rows])
        ce = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        return kd + ce_weight * ce

    draft.train()
    return _fit("draft", list(draft.parameters()), stage, loss_fn, report)


def train_medusa(heads: MedusaHeads, tp: TeacherPass, stage: Stage, gen: torch.Generator,
                 report: Reporter, ce_weight: float = 0.1) -> tuple[float, float]:
    """Head h at position t learns the teacher's top-k at t+1+h (which predicts x_{t+2+h})."""
    n = len(heads.heads)
    T = tp.feats.shape[1]

    def loss_fn(step: int) -> Tensor:
        rows = torch.randint(0, len(tp.ids), (stage.batch,), generator=gen)
        f = tp.feats[rows].float()
        ids = tp.ids[rows]
        total = torch.zeros(())
        for h, head in enumerate(heads.heads):
            valid = T - 1 - h  # positions t = 0..T-2-h have a teacher row at t+1+h
            logits = head[1](f[:, :valid] + F.silu(head[0](f[:, :valid])))
            kd = soft_ce(logits, tp.top_logits[rows, 1 + h:], tp.top_ids[rows, 1 + h:])
            ce = F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 2 + h: 2 + h + valid].flatten())
            total = total + (kd + ce_weight * ce) * (0.8 ** h)
        return total / n

    heads.train()
    return _fit("medusa", list(heads.parameters()), stage, loss_fn, report)


def train_eagle(head: EagleHead, target: Llama, tp: TeacherPass, stage: Stage, gen: torch.Generator,
                report: Reporter, noise: float = 0.1, logit_weight: float = 0.1) -> tuple[float, float]:
    """smooth-L1(f^_{t+1}, f_{t+1}) + 0.1 * soft-CE(L f^_{t+1}, teacher top-k at t+1); inputs are
    E[x_{t+1}] and f_t with uniform noise (EAGLE-1 recipe). E and L stay frozen."""
    embed, lm_head = target.model.embed_tokens, target.lm_head

    def loss_fn(step: int) -> Tensor:
        rows = torch.randint(0, len(tp.ids), (stage.batch,), generator=gen)
        f = tp.feats[rows].float()
        ids = tp.ids[rows]
        f_in = f[:, :-1] + (torch.rand(f[:, :-1].shape, generator=gen) - 0.5) * 2 * noise
        with torch.no_grad():
            e = embed(ids[:, 1:-1])
        pred = head(e, f_in)
        feat_loss = F.smooth_l1_loss(pred.float(), f[:, 1:])
        logits = lm_head(pred)
        kd = soft_ce(logits, tp.top_logits[rows, 1:], tp.top_ids[rows, 1:])
        return feat_loss + logit_weight * kd

    for p in target.parameters():
        p.requires_grad_(False)
    head.train()
    return _fit("eagle", list(head.parameters()), stage, loss_fn, report)


# --------------------------------------------------------------------------------------------
# Measurement: losses, agreement, and a tiny greedy speculative loop (recompute, no cache)
# --------------------------------------------------------------------------------------------


def _eval_windows(stream: Tensor, n: int, seq_len: int) -> Tensor:
    n = min(n, (len(stream) - 1) // (seq_len + 1))
    stride = (len(stream) - 1) // n
    return _windows(stream, torch.arange(n) * stride, seq_len + 1)


@torch.no_grad()
def lm_loss(model: Llama, windows: Tensor, chunk: int = 8) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), chunk):
        w = windows[i: i + chunk]
        logits, _ = model(w[:, :-1])
        total += F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        count += w[:, 1:].numel()
    return total / count


@torch.no_grad()
def draft_agreement(target: Llama, draft: Llama, windows: Tensor) -> float:
    """Teacher-forced α: how often argmax draft == argmax target at the same position."""
    tl, _ = target(windows[:, :-1])
    dl, _ = draft(windows[:, :-1])
    return (tl.argmax(-1) == dl.argmax(-1)).float().mean().item()


@torch.no_grad()
def medusa_eval(target: Llama, heads: MedusaHeads, windows: Tensor) -> dict:
    """Per head: top-1 agreement with the target's greedy token at t+1+h, and CE on x_{t+2+h}."""
    tl, f = target(windows[:, :-1])
    greedy = tl.argmax(-1)
    logits = heads(f)
    T = f.shape[1]
    top1, ce = [], []
    for h in range(len(heads.heads)):
        valid = T - 1 - h
        lh = logits[h, :, :valid]
        top1.append((lh.argmax(-1) == greedy[:, 1 + h:]).float().mean().item())
        ce.append(F.cross_entropy(lh.flatten(0, 1), windows[:, 2 + h: 2 + h + valid].flatten()).item())
    return {"top1": top1, "heldout_ce": ce}


@torch.no_grad()
def eagle_eval(target: Llama, head: EagleHead, windows: Tensor) -> dict:
    """Teacher-forced: top-1 of L f^_{t+1} vs the target's greedy token at t+1; CE on x_{t+2}."""
    tl, f = target(windows[:, :-1])
    pred = head(target.model.embed_tokens(windows[:, 1:-1]), f[:, :-1])
    logits = target.lm_head(pred)
    return {
        "top1": (logits.argmax(-1) == tl[:, 1:].argmax(-1)).float().mean().item(),
        "heldout_ce": F.cross_entropy(logits.flatten(0, 1), windows[:, 2:].flatten()).item(),
        "feature_smooth_l1": F.smooth_l1_loss(pred, f[:, 1:]).item(),
    }


# A proposer sees (tokens so far incl. the target's newest token, target features f for all but
# the newest token) and returns K greedy guesses for the tokens after the newest one.
Proposer = Callable[[Tensor, Tensor, int], list[int]]


def draft_proposer(draft: Llama) -> Proposer:
    def propose(ids: Tensor, feats: Tensor, k: int) -> list[int]:
        seq = ids.clone()
        out = []
        for _ in range(k):
            logits, _ = draft(seq[None])
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
            seq = torch.cat([seq, torch.tensor([nxt])])
        return out

    return propose


def medusa_proposer(heads: MedusaHeads) -> Proposer:
    def propose(ids: Tensor, feats: Tensor, k: int) -> list[int]:
        return [int(t) for t in heads(feats[-1]).argmax(-1)[:k]]

    return propose


def eagle_proposer(head: EagleHead, target: Llama) -> Proposer:
    def propose(ids: Tensor, feats: Tensor, k: int) -> list[int]:
        emb = target.model.embed_tokens
        g = feats.clone()                # g_0..g_t  (verified features)
        nxt = ids[1:].clone()            # x_1..x_{t+1}
        out = []
        for _ in range(k):
            f_hat = head(emb(nxt)[None], g[None])[0, -1]
            d = int(target.lm_head(f_hat).argmax())
            out.append(d)
            g = torch.cat([g, f_hat[None]])
            nxt = torch.cat([nxt, torch.tensor([d])])
        return out

    return propose


@torch.no_grad()
def greedy(target: Llama, prompt: Tensor, n_new: int) -> list[int]:
    seq = prompt.clone()
    for _ in range(n_new):
        logits, _ = target(seq[None])
        seq = torch.cat([seq, logits[0, -1].argmax()[None]])
    return seq[len(prompt):].tolist()


@torch.no_grad()
def speculative_greedy(target: Llama, propose: Proposer, prompt: Tensor, n_new: int, k: int) -> dict:
    """Greedy speculative decoding with one target forward per step (prefill included).

    Every step: the proposer drafts k tokens after the newest token; the target scores
    [seq, drafts] in one forward; the longest prefix of drafts equal to the target's argmax is
    accepted and the target's own next token is appended (1..k+1 tokens per forward)."""
    logits, f = target(prompt[None])
    seq = torch.cat([prompt, logits[0, -1].argmax()[None]])
    feats = f[0]
    forwards, drafted, accepted = 1, 0, 0
    while len(seq) - len(prompt) < n_new:
        guess = propose(seq, feats, k)
        cand = torch.cat([seq, torch.tensor(guess, dtype=torch.long)])
        logits, f = target(cand[None])
        forwards += 1
        pred = logits[0, len(seq) - 1:].argmax(-1)  # pred[i] is the target's token after cand[len(seq)-1+i]
        n_ok = 0
        while n_ok < k and guess[n_ok] == int(pred[n_ok]):
            n_ok += 1
        drafted += k
        accepted += n_ok
        seq = torch.cat([cand[: len(seq) + n_ok], pred[n_ok][None]])
        feats = f[0, : len(seq) - 1]
    out = seq[len(prompt): len(prompt) + n_new].tolist()
    return {"tokens": out, "forwards": forwards, "drafted": drafted, "accepted": accepted}


def measure_acceptance(target: Llama, propose: Proposer, prompts: list[Tensor], n_new: int,
                       ks: Sequence[int], reference: list[list[int]] | None = None) -> dict:
    """τ = new tokens / target forwards (prefill counted), acc = accepted / drafted."""
    out = {}
    for k in ks:
        fw = dr = ac = same = 0
        for i, p in enumerate(prompts):
            r = speculative_greedy(target, propose, p, n_new, k)
            fw, dr, ac = fw + r["forwards"], dr + r["drafted"], ac + r["accepted"]
            same += int(reference is not None and r["tokens"] == reference[i])
        out[str(k)] = {
            "tau": round(n_new * len(prompts) / fw, 3),
            "acceptance_rate": round(ac / max(1, dr), 3),
            "matches_plain_greedy": f"{same}/{len(prompts)}" if reference is not None else None,
        }
    return out


# --------------------------------------------------------------------------------------------
# Held-out prompts (used by benchmarks)
# --------------------------------------------------------------------------------------------


def _load_tokenizer(directory: Path):
    from tokenizers import Tokenizer

    path = directory / "tokenizer.json"
    if not path.is_file():
        raise ModelError(f"no tokenizer at {path}", hint="run `trtspec models train-demo` first")
    return Tokenizer.from_file(str(path))


def _snippets(tok, corpus_root: Path, files: Sequence[str], n: int, prompt_tokens: int,
              seed: int) -> list[str]:
    """n deterministic snippets of exactly prompt_tokens tokens, each starting at a line start
    and round-tripping through the tokenizer; files are taken round-robin in a seeded order."""
    rng = random.Random(seed)
    order = list(files)
    rng.shuffle(order)
    encoded: dict[str, tuple[str, list[int], list[int]] | None] = {}
    out: list[str] = []
    attempts = 0
    while len(out) < n and attempts < 50 * n + 100:
        rel = order[attempts % len(order)]
        attempts += 1
        if rel not in encoded:
            path = corpus_root / rel
            if not path.is_file():
                encoded[rel] = None
                continue
            text = path.read_text(encoding="utf-8")
            enc = tok.encode(text)
            starts = [i for i, (a, _) in enumerate(enc.offsets)
                      if (a == 0 or text[a - 1] == "\n") and text[a: a + 1] not in ("\n", "")
                      and i + 2 * prompt_tokens < len(enc.ids)]
            encoded[rel] = (text, enc.ids, starts)
        entry = encoded[rel]
        if entry is None:
            continue
        text, ids, line_starts = entry
        if not line_starts:
            continue
        start = rng.choice(line_starts)
        piece = tok.decode(ids[start: start + prompt_tokens])
        if (not piece.strip() or "\ufffd" in piece or piece in out
                or tok.encode(piece).ids != ids[start: start + prompt_tokens]):
            continue
        out.append(piece)
    if len(out) < n:
        raise ModelError(f"could only cut {len(out)} of {n} held-out prompts of {prompt_tokens} tokens",
                         hint="ask for fewer or shorter prompts")
    return out


def heldout_prompts(n: int, prompt_tokens: int = 64, seed: int = 0, *,
                    models_dir: str | Path | None = None) -> list[str]:
    """n deterministic code snippets from the demo family's held-out stdlib files.

    Each snippet starts at a line start and encodes to exactly `prompt_tokens` tokens with the
    family's tokenizer (no special tokens). Held-out files are read from `models_dir`'s
    MANIFEST.json (default examples/models) and resolved against this interpreter's stdlib;
    without a manifest the split rule of `stdlib_corpus` is used."""
    directory = Path(models_dir) if models_dir is not None else DEFAULT_MODELS_DIR
    if n < 1 or prompt_tokens < 1:
        raise ModelError("heldout_prompts needs n >= 1 and prompt_tokens >= 1")
    tok = _load_tokenizer(directory / "target")
    manifest = directory / "MANIFEST.json"
    root = Path(sysconfig.get_paths()["stdlib"])
    if manifest.is_file():
        files = json.loads(manifest.read_text())["corpus"]["heldout_files"]
    else:
        files = list(stdlib_corpus(root).heldout_files)
    return _snippets(tok, root, files, n, prompt_tokens, seed)


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------


def _fp16_roundtrip(m: nn.Module) -> None:
    """Round the weights to float16 in place (what is shipped) so later stages see them."""
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.float16).float())


def save_llama(model: Llama, out: Path, tokenizer_dir: Path) -> None:
    """transformers LlamaForCausalLM checkpoint in float16 plus the shared tokenizer files."""
    from transformers import GenerationConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    hf = LlamaForCausalLM(model.s.hf_config(dtype="float16"))
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if "rotary" not in k]
    if missing or unexpected:  # pragma: no cover - a bug, not a user error
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    hf.to(torch.float16).save_pretrained(str(out))
    cfg_path = out / "config.json"  # also spell the keys transformers 4.x readers look for
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", model.s.rope_theta)
    cfg.setdefault("torch_dtype", "float16")
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    GenerationConfig(bos_token_id=0, eos_token_id=0, pad_token_id=0, do_sample=False).save_pretrained(str(out))
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out / name)


def _save_safetensors(tensors: dict[str, Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: v.detach().to(torch.float16).contiguous() for k, v in tensors.items()}, str(path),
              metadata={"format": "pt"})


def save_medusa(heads: MedusaHeads, s: LlamaShape, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _save_safetensors(heads.trtllm_state_dict(), out / "medusa_lm_head.safetensors")
    cfg = {"medusa_num_heads": len(heads.heads), "medusa_num_layers": 1, "hidden_size": s.dim,
           "vocab_size": s.vocab, "base_model_name_or_path": "../target"}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def save_eagle(head: EagleHead, s: LlamaShape, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    _save_safetensors(dict(head.state_dict()), out / "model.safetensors")
    cfg = json.loads(replace(s, n_layer=1).hf_config(dtype="float16").to_json_string(use_diff=True))
    cfg.update(architectures=["LlamaForCausalLM"], eagle=True, base_model_name_or_path="../target",
               bias=True, rope_theta=s.rope_theta, torch_dtype="float16")  # bias: fc has one (EAGLE-1)
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def load_medusa(directory: Path) -> MedusaHeads:
    from safetensors.torch import load_file

    cfg = json.loads((directory / "config.json").read_text())
    heads = MedusaHeads(cfg["hidden_size"], cfg["vocab_size"], cfg["medusa_num_heads"])
    sd = load_file(str(directory / "medusa_lm_head.safetensors"))
    for h, head in enumerate(heads.heads):
        head[0].weight.data.copy_(sd[f"{h}.0.linear.weight"].float())
        head[0].bias.data.copy_(sd[f"{h}.0.linear.bias"].float())
        head[1].weight.data.copy_(sd[f"{h}.1.weight"].float())
    return heads


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_table(root: Path) -> dict[str, dict]:
    return {
        p.relative_to(root).as_posix(): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
        for p in sorted(root.rglob("*")) if p.is_file() and p.name != "MANIFEST.json"
    }


# --------------------------------------------------------------------------------------------
# The whole family
# --------------------------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    import tokenizers
    import transformers

    from trtspec import __version__

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
            "trtspec": __version__}


def _r(x: float) -> float:
    return round(float(x), 4)


def train_family(out: str | Path, cfg: FamilyConfig = FamilyConfig(), report: Reporter = _silent,
                 force: bool = False, log: Callable[[str], None] = lambda s: None) -> dict:
    """Train tokenizer, target, draft, Medusa and EAGLE heads; write them atomically to `out`.

    Training happens in a temporary directory next to `out`, which is renamed into place at the
    end; an existing non-empty `out` is replaced only with force=True. Returns the manifest."""
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise ModelError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ModelError(f"{out} is not empty", hint="pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        manifest = _train_into(tmp, cfg, report, log)
        manifest["wall_s_total"] = round(time.perf_counter() - t_start, 1)
        manifest["files"] = file_table(tmp)
        (tmp / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _train_into(root: Path, cfg: FamilyConfig, report: Reporter, log: Callable[[str], None]) -> dict:
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    T = cfg.seq_len

    # -- corpus + tokenizer
    corpus = stdlib_corpus(max_files=cfg.max_files, max_file_bytes=cfg.max_file_bytes)
    train_texts = [corpus.read(f) for f in corpus.train_files]
    held_texts = [corpus.read(f) for f in corpus.heldout_files]
    tok = train_tokenizer(train_texts)
    tok_dir = root / ".tokenizer"
    save_tokenizer(tok, tok_dir)
    train_stream, held_stream = encode_files(tok, train_texts), encode_files(tok, held_texts)
    log(f"corpus: {len(corpus.train_files)} train files ({len(train_stream):,} tokens), "
        f"{len(corpus.heldout_files)} held out ({len(held_stream):,} tokens)")
    train_eval = _eval_windows(train_stream, cfg.eval_seqs, T)
    held_eval = _eval_windows(held_stream, cfg.eval_seqs, T)
    models: dict[str, dict] = {}

    # -- target
    target = Llama(cfg.target)
    last, wall = train_lm(target, train_stream, cfg.target_stage, T, gen, report)
    _fp16_roundtrip(target)
    save_llama(target, root / "target", tok_dir)
    models["target"] = {
        "path": "target", "params": n_params(target), "shape": asdict(cfg.target),
        "train": {**asdict(cfg.target_stage), "seq_len": T, "wall_s": round(wall, 1),
                  "tokens_seen": cfg.target_stage.steps * cfg.target_stage.batch * T,
                  "final_train_loss_ema": _r(last)},
        "loss": {"train": _r(lm_loss(target, train_eval)), "heldout": _r(lm_loss(target, held_eval))},
    }
    log(f"target: {models['target']['loss']} in {wall:.0f}s")
    target.eval()
    for p in target.parameters():
        p.requires_grad_(False)

    # -- one frozen-target pass shared by draft, Medusa and EAGLE
    tp = teacher_pass(target, train_stream, cfg.teacher_seqs, T, cfg.topk, gen, report)
    teacher_info = {"sequences": len(tp.ids), "seq_len": T, "topk": cfg.topk, "wall_s": round(tp.wall_s, 1),
                    "stored": "f_t (fp16) and top-k logits of the fp16-rounded target, bf16 autocast"}
    log(f"teacher pass: {len(tp.ids)} x {T} tokens in {tp.wall_s:.0f}s")

    # -- draft
    draft = Llama(cfg.draft)
    last, wall = train_draft(draft, tp, cfg.draft_stage, gen, report)
    _fp16_roundtrip(draft)
    save_llama(draft, root / "draft", tok_dir)
    models["draft"] = {
        "path": "draft", "params": n_params(draft), "shape": asdict(cfg.draft),
        "train": {**asdict(cfg.draft_stage), "seq_len": T, "wall_s": round(wall, 1),
                  "teacher_topk": cfg.topk, "final_train_loss_ema": _r(last)},
        "loss": {"train": _r(lm_loss(draft, train_eval)), "heldout": _r(lm_loss(draft, held_eval))},
    }
    draft.eval()
    log(f"draft: {models['draft']['loss']} in {wall:.0f}s")

    # -- Medusa
    medusa = MedusaHeads(cfg.target.dim, cfg.target.vocab)
    with torch.no_grad():
        for head in medusa.heads:
            head[1].weight.copy_(target.lm_head.weight)
    last, wall = train_medusa(medusa, tp, cfg.medusa_stage, gen, report)
    _fp16_roundtrip(medusa)
    save_medusa(medusa, cfg.target, root / "medusa")
    medusa.eval()
    models["medusa"] = {
        "path": "medusa", "params": n_params(medusa), "num_heads": len(medusa.heads),
        "train": {**asdict(cfg.medusa_stage), "wall_s": round(wall, 1), "final_train_loss_ema": _r(last)},
    }
    log(f"medusa: trained in {wall:.0f}s")

    # -- EAGLE
    eagle = EagleHead(cfg.target)
    last, wall = train_eagle(eagle, target, tp, cfg.eagle_stage, gen, report)
    _fp16_roundtrip(eagle)
    save_eagle(eagle, cfg.target, root / "eagle")
    eagle.eval()
    models["eagle"] = {
        "path": "eagle", "params": n_params(eagle), "train": {**asdict(cfg.eagle_stage), "wall_s": round(wall, 1),
                                                          "final_train_loss_ema": _r(last)},
    }
    log(f"eagle: trained in {wall:.0f}s")
    del tp

    # -- measurement (fp32 compute on the fp16-rounded weights)
    t0 = time.perf_counter()
    with torch.no_grad():
        agree_windows = held_eval[: max(1, cfg.eval_seqs // 2)]
        models["draft"]["alpha_teacher_forced"] = _r(draft_agreement(target, draft, agree_windows))
        med = medusa_eval(target, medusa, agree_windows)
        models["medusa"]["head_top1"] = [_r(x) for x in med["top1"]]
        models["medusa"]["heldout_ce"] = [_r(x) for x in med["heldout_ce"]]
        eag = eagle_eval(target, eagle, agree_windows)
        models["eagle"].update({k: _r(v) for k, v in eag.items()})

    prompt_texts = _snippets(tok, corpus.root, corpus.heldout_files, cfg.accept_prompts,
                             cfg.accept_prompt_tokens, cfg.seed)
    prompts = [torch.tensor(tok.encode(p).ids) for p in prompt_texts]
    n_new = cfg.accept_new_tokens
    reference = [greedy(target, p, n_new) for p in prompts]
    report("measure", 1, 4, None)
    models["draft"]["acceptance"] = measure_acceptance(target, draft_proposer(draft), prompts, n_new, (2, 4, 8),
                                                       reference)
    report("measure", 2, 4, None)
    models["medusa"]["acceptance"] = measure_acceptance(target, medusa_proposer(medusa), prompts, n_new, (4,),
                                                        reference)
    report("measure", 3, 4, None)
    models["eagle"]["acceptance"] = measure_acceptance(target, eagle_proposer(eagle, target), prompts, n_new, (4,),
                                                       reference)
    report("measure", 4, 4, None)
    log(f"measurement in {time.perf_counter() - t0:.0f}s")

    shutil.rmtree(tok_dir)
    return {
        "format": 1,
        "created_by": "trtspec models train-demo" + (" --quick" if cfg.quick else ""),
        "seed": cfg.seed,
        "config": asdict(cfg),
        "versions": _versions(),
        "machine": {"cpus": os.cpu_count(), "threads": cfg.threads, "platform": platform.platform()},
        "corpus": {
            "source": "python stdlib *.py (sysconfig stdlib path)",
            "excluded": "test/tests/test_*/idle_test dirs, " + ", ".join(EXCLUDED_DIRS),
            "split_rule": f"sorted relative paths; file i held out iff i % {HELDOUT_EVERY} == {HELDOUT_OFFSET}",
            "train_files": len(corpus.train_files), "train_tokens": len(train_stream),
            "heldout_tokens": len(held_stream), "heldout_files": list(corpus.heldout_files),
        },
        "tokenizer": {"type": "byte-level BPE", "vocab_size": tok.get_vocab_size(), "special_tokens": [EOT],
                      "bos_eos_pad": EOT, "files": list(TOKENIZER_FILES)},
        "teacher_pass": teacher_info,
        "measurement": {
            "what": "greedy speculative decoding, recomputed without cache, fp32 compute on the fp16 weights",
            "prompts": len(prompts), "prompt_tokens": cfg.accept_prompt_tokens, "new_tokens": n_new,
            "prompt_source": "heldout_prompts(n, prompt_tokens, seed)",
            "alpha": "teacher-forced argmax agreement on held-out windows",
            "tau": "new tokens / target forwards (prefill counted)",
            "acceptance_rate": "accepted drafted tokens / drafted tokens",
            "medusa_head_top1": "head h at t vs the target's greedy token at t+1+h, teacher-forced",
            "chain": "medusa/eagle candidate = [target's next token, K head guesses]",
        },
        "models": models,
    }
