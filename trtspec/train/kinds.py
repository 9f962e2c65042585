"""What each kind of `trtspec train` trains: its module (initialised from the target where it can), its loss,
the writer of its layout, and the architecture the manifest records.

  eagle3       an EAGLE-3 head (train/eagle3_head.py) on three captured target layers; the TTT loss
  eagle        an EAGLE-1 head (fc + one decoder layer, train/modules.py) on the target's final hidden state
  medusa       Medusa heads: residual blocks and the lm_head rows of the draft vocabulary (initialised from
               the target's; the other rows stay the target's)
  draft-model  a small Llama (`draft_layers` x `draft_hidden`; the target's vocabulary and tokenizer,
               embeddings and lm_head initialised from the target's when the widths agree)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import torch

from trtspec.artifacts import heads as layouts
from trtspec.artifacts.hf import ModelConfig
from trtspec.artifacts.weights import load_weights
from trtspec.errors import ModelError
from trtspec.train.eagle3_head import Eagle3Head, ttt_loss
from trtspec.train.losses import draft_loss, eagle1_loss, medusa_loss
from trtspec.train.loop import Loss
from trtspec.train.recipe import TrainConfig
from trtspec.train.writers import write_draft_model, write_eagle1, write_eagle3_head, write_medusa_heads


@dataclasses.dataclass(frozen=True)
class Drafter:
    """A kind's module to train, its loss, a writer of its layout into a dir, and the layout's architecture."""

    module: torch.nn.Module
    loss: Loss
    write: Callable[[Path], None]
    architecture: str


def head_config(target: ModelConfig, cfg: TrainConfig) -> ModelConfig:
    """The midlayer's shape: the target's attention and RoPE, its MLP unless set."""
    return dataclasses.replace(target, num_layers=1,
                               intermediate_size=cfg.intermediate_size or target.intermediate_size,
                               architectures=(layouts.EAGLE3_ARCHITECTURE,), layer_types=())


def draft_config(t: ModelConfig, cfg: TrainConfig) -> ModelConfig:
    """The distilled draft's shape: the target's vocabulary, RoPE and special ids; `draft_layers` layers of
    width `draft_hidden` (heads scaled by the width, head_dim kept), untied; a Llama."""
    H = cfg.draft_hidden or t.hidden_size
    heads = max(1, round(t.num_heads * H / t.hidden_size))
    kv = max(1, min(heads, round(t.num_kv_heads * H / t.hidden_size)))
    while heads % kv:
        kv -= 1
    return dataclasses.replace(
        t, model_type="llama", architectures=("LlamaForCausalLM",), num_layers=cfg.draft_layers, hidden_size=H,
        intermediate_size=max(8, round(t.intermediate_size * H / t.hidden_size)), num_heads=heads,
        num_kv_heads=kv, head_dim=t.head_dim if heads * t.head_dim == H else H // heads,
        tie_word_embeddings=False, layer_types=(), sliding_window=None, torch_dtype="float16")


def load_file_tensor(ckpt: Path, suffix: str) -> torch.Tensor:
    w = load_weights(ckpt)
    for name in (suffix, f"model.{suffix}"):
        if name in w:
            return w[name]
    raise ModelError(f"{ckpt}: no {suffix}", hint="the EAGLE-3 head reuses the target's embedding")


def _target_lm_head(target: Path, tcfg: ModelConfig) -> torch.Tensor:
    w = load_weights(target)
    for name in ("lm_head.weight", "model.lm_head.weight"):
        if name in w and not tcfg.tie_word_embeddings:
            return w[name].float()
    return load_file_tensor(target, "embed_tokens.weight").float()


def _eagle3(target: Path, tcfg: ModelConfig, cfg: TrainConfig, feats: dict[str, torch.Tensor], base: str) -> Drafter:
    layer = head_config(tcfg, cfg)
    embed = load_file_tensor(target, "embed_tokens.weight")  # [V, H]
    lengths = feats["offsets"][1:] - feats["offsets"][:-1]  # [num_samples]
    head = Eagle3Head(layer, tcfg.hidden_size, feats["used"], embed,
                      max_positions=int(lengths.max()) + 16).to(cfg.device)
    aux = layouts.default_aux_layers(tcfg.num_layers)

    def loss(m, b, step):
        return ttt_loss(m, b["ids"], b["feats"], b["top_ids"], b["top_logits"], b["mask"], cfg.ttt_steps)

    return Drafter(head, loss, lambda d: write_eagle3_head(d, head, layer, tcfg, aux), layouts.EAGLE3_ARCHITECTURE)


def _medusa(target: Path, tcfg: ModelConfig, cfg: TrainConfig, feats: dict[str, torch.Tensor], base: str) -> Drafter:
    from trtspec.train.modules import VocabMedusa

    lm = _target_lm_head(target, tcfg)  # [V, H]
    heads = VocabMedusa(tcfg.hidden_size, lm[feats["used"]], cfg.medusa_heads).to(cfg.device)
    return Drafter(heads, lambda m, b, step: medusa_loss(m, b),
                   lambda d: write_medusa_heads(d, heads, lm, feats["used"], tcfg, base), "MedusaHeads")


def _eagle1(target: Path, tcfg: ModelConfig, cfg: TrainConfig, feats: dict[str, torch.Tensor], base: str) -> Drafter:
    from trtspec.train.modules import EagleHead

    lm = _target_lm_head(target, tcfg)  # [V, H]
    layer = dataclasses.replace(head_config(tcfg, cfg), architectures=("LlamaForCausalLM",), model_type="llama",
                                tie_word_embeddings=False, sliding_window=None, torch_dtype="float16")
    head = EagleHead(layer).to(cfg.device)
    embed = load_file_tensor(target, "embed_tokens.weight").float().to(cfg.device)  # [V, H]
    lm_used = lm[feats["used"]].to(cfg.device)  # [draft_vocab, H]

    def loss(m, b, step):
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)  # resumable: noise per step
        return eagle1_loss(m, lm_used, embed, b, cfg.noise, gen)

    return Drafter(head, loss, lambda d: write_eagle1(d, head, layer, base), "LlamaForCausalLM (EAGLE-1 head)")


def _draft_model(target: Path, tcfg: ModelConfig, cfg: TrainConfig, feats: dict[str, torch.Tensor],
                 base: str) -> Drafter:
    from transformers import LlamaForCausalLM

    lm = _target_lm_head(target, tcfg)  # [V, H]
    used = feats["used"].to(cfg.device)  # [draft_vocab]: target ids
    dc = draft_config(tcfg, cfg)
    hf = dc.to_hf()
    hf._attn_implementation = "sdpa"
    model = LlamaForCausalLM(hf)
    with torch.no_grad():
        if dc.hidden_size == tcfg.hidden_size:  # start from the target's embeddings and LM head
            model.model.embed_tokens.weight.copy_(load_file_tensor(target, "embed_tokens.weight").float())
            model.lm_head.weight.copy_(lm)
    model = model.to(cfg.device)
    return Drafter(model, lambda m, b, step: draft_loss(m, b, used), lambda d: write_draft_model(d, model, dc, target),
                   "LlamaForCausalLM")


BUILDERS = {"eagle3": _eagle3, "eagle": _eagle1, "medusa": _medusa, "draft-model": _draft_model}


def build(kind: str, target: Path, tcfg: ModelConfig, cfg: TrainConfig, feats: dict[str, torch.Tensor],
          target_name: str | None = None) -> Drafter:
    """The `kind` drafter for the target, initialised with the run's seed. target_name: the
    base_model_name_or_path the head configs record (default: the target path as given)."""
    torch.manual_seed(cfg.seed)  # the module's initialisation
    return BUILDERS[kind](Path(target), tcfg, cfg, feats, target_name or str(target))
