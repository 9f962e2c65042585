"""A tiny random model family for the runtime tests: target, draft, Medusa heads, EAGLE head, tokenizer, specs.

Random weights are drawn with a large init scale so that greedy decisions have clear margins (argmax ties
between two computations that differ by float rounding would make identity tests flaky, not wrong).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

VOCAB = 96
EOS = VOCAB - 1


def llama_config(**kw):
    from transformers import LlamaConfig

    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=False,
                initializer_range=0.25, bos_token_id=0, eos_token_id=EOS, pad_token_id=None)
    base.update(kw)
    return LlamaConfig(**base)


def save_llama(path: Path, seed: int, **kw):
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(**kw)).eval()
    with torch.no_grad():  # norms at 1 + noise, so the random nets are not all-symmetric
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return model


def save_tokenizer(path: Path, vocab: int = VOCAB):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab - 2)}
    words["<unk>"], words["</s>"] = vocab - 2, vocab - 1
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(path)


def save_medusa(path: Path, heads: int, hidden: int, vocab: int, seed: int, scale: float = 0.3):
    from trtspec.artifacts.heads import write_medusa

    g = torch.Generator().manual_seed(seed)
    w = {}
    for h in range(heads):
        w[f"{h}.0.linear.weight"] = torch.randn(hidden, hidden, generator=g) * scale
        w[f"{h}.0.linear.bias"] = torch.randn(hidden, generator=g) * scale
        w[f"{h}.1.weight"] = torch.randn(vocab, hidden, generator=g) * scale
    write_medusa(path, w, hidden_size=hidden, vocab_size=vocab, num_layers=1)


def save_eagle(path: Path, seed: int, **kw):
    from trtspec.artifacts.heads import write_eagle

    cfg = llama_config(num_hidden_layers=1, **kw)
    g = torch.Generator().manual_seed(seed)
    H, FF = cfg.hidden_size, cfg.intermediate_size
    D = cfg.head_dim if getattr(cfg, "head_dim", None) else H // cfg.num_attention_heads
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    r = lambda *s: torch.randn(*s, generator=g) * 0.2  # noqa: E731
    w = {"fc.weight": r(H, 2 * H), "fc.bias": r(H),
         "layers.0.self_attn.q_proj.weight": r(nh * D, H), "layers.0.self_attn.k_proj.weight": r(nkv * D, H),
         "layers.0.self_attn.v_proj.weight": r(nkv * D, H), "layers.0.self_attn.o_proj.weight": r(H, nh * D),
         "layers.0.mlp.gate_proj.weight": r(FF, H), "layers.0.mlp.up_proj.weight": r(FF, H),
         "layers.0.mlp.down_proj.weight": r(H, FF), "layers.0.post_attention_layernorm.weight": 1 + r(H)}
    write_eagle(path, w, cfg)


def build_family(root: Path) -> Path:
    """root/{target,draft,medusa,eagle} + one spec per method; returns root."""
    root = Path(root)
    save_llama(root / "target", seed=1)
    save_tokenizer(root / "target")
    save_llama(root / "draft", seed=2, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
               num_attention_heads=2, num_key_value_heads=1)
    save_medusa(root / "medusa", heads=3, hidden=64, vocab=VOCAB, seed=3)
    save_eagle(root / "eagle", seed=4)
    return root


def write_spec(root: Path, method: str, *, k: int = 4, choices=None, batch: int = 4, adaptive: bool = True,
               max_input_len: int = 64, max_output_len: int = 64, target: str = "target", draft: str = "draft",
               heads: str | None = None, extra: str = "") -> Path:
    lines = ["schema = 1", "[model]", f'name = "t-{method}"', f'target = "{target}"', 'dtype = "float32"',
             "[speculative]", f'method = "{method}"', f"num_draft_tokens = {k}"]
    if method == "draft-model":
        lines.append(f'draft = "{draft}"')
    if method in ("medusa", "eagle"):
        lines.append(f'heads = "{heads or method}"')
    if choices is not None:
        lines.append(f"choices = {json.dumps(choices)}")
    lines += ["[speculative.adaptive]", f"enabled = {'true' if adaptive else 'false'}",
              "[limits]", f"max_batch_size = {batch}", f"max_input_len = {max_input_len}",
              f"max_output_len = {max_output_len}", "[runtime]", 'kind = "torch"', 'device = "cpu"', extra]
    text = "\n".join(lines) + "\n"
    import hashlib

    path = root / f"spec-{method}-{hashlib.sha1(text.encode()).hexdigest()[:10]}.toml"
    path.write_text(text)
    return path


def engine(root: Path, method: str = "none", **kw):
    """A SpecEngine for a spec written into the family dir."""
    from trtspec import methods
    from trtspec.check import load_spec

    return methods.engine(load_spec(write_spec(root, method, **kw)))

def save_noisy_copy(src: Path, dst: Path, noise: float, seed: int) -> None:
    """A draft that mostly agrees with its target: the target's weights plus relative Gaussian noise."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    g = torch.Generator().manual_seed(seed)
    w = load_file(str(dst / "model.safetensors"))
    w = {k: v + noise * v.std() * torch.randn(v.shape, generator=g) for k, v in w.items()}
    save_file(w, str(dst / "model.safetensors"))


def save_eagle_oracle(root: Path, seed: int = 11, vocab: int = VOCAB) -> tuple[Path, Path]:
    """A 1-layer target and an EAGLE head that reproduces it: returns (target dir, eagle dir).

    Target: unit-RMS embedding rows and all norm weights 1, so its input norm is (almost) the identity and
    its final norm only rescales. Head: fc = [I, 0] (x_t = embed(token_{t+1})) and the target's own layer.
    The head then computes the target's pre-norm hidden state one position early; RoPE only sees relative
    positions, so the only difference is that the head never attends to token 0. High but not perfect
    acceptance: what a correctly wired EAGLE drafter must show.
    """
    from safetensors.torch import load_file, save_file

    from trtspec.artifacts.heads import write_eagle

    tdir, edir = root / "target1", root / "eagle_oracle"
    save_llama(tdir, seed=seed, num_hidden_layers=1, vocab_size=vocab, rms_norm_eps=1e-9)
    w = load_file(str(tdir / "model.safetensors"))
    emb = w["model.embed_tokens.weight"]
    w["model.embed_tokens.weight"] = emb / emb.pow(2).mean(-1, keepdim=True).sqrt()
    for k in list(w):
        if k.endswith("layernorm.weight") and "input" in k or k == "model.norm.weight":
            w[k] = torch.ones_like(w[k])
    save_file(w, str(tdir / "model.safetensors"))
    save_tokenizer(tdir, vocab)
    H = w["model.norm.weight"].shape[0]
    e = {"fc.weight": torch.cat([torch.eye(H), torch.zeros(H, H)], 1), "fc.bias": torch.zeros(H)}
    for k, v in w.items():
        if k.startswith("model.layers.0.") and "input_layernorm" not in k:
            e[k.removeprefix("model.")] = v
    write_eagle(edir, e, llama_config(num_hidden_layers=1, vocab_size=vocab, rms_norm_eps=1e-9))
    return tdir, edir
