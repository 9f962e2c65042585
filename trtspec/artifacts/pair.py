"""Pair validation: does the drafter fit the target? (tokenizer, vocab, lengths, heads), and does each
checkpoint's config.json describe its own weights (vocab, hidden size, layers, heads)?

Reads only config files (through ModelConfig and the head readers), `tokenizer.json` and the safetensors
*headers* (tensor names and shapes, never the tensors), so it is fast: a config that disagrees with its
weights is reported here instead of failing, or silently misbehaving, when the server loads the model.

The drafter's side is its method's (`Drafter`: trtspec/methods/base.py's pair rules), which the caller passes in
(trtspec.methods.check_pair composes the two for the spec's method).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Protocol

from trtspec.artifacts import heads as layouts, tokenizer
from trtspec.artifacts.fs import read_json_object
from trtspec.artifacts.hf import CONFIG, DECODER_ARCHITECTURES, ModelConfig, summary
from trtspec.artifacts.weights import weight_shapes
from trtspec.errors import ModelError
from trtspec.spec import Problem, Spec

SUPPORTED_ARCHITECTURES = tuple(DECODER_ARCHITECTURES.values())


class Drafter(Protocol):
    """What the pair check asks of the spec's method (trtspec.methods.Method's pair rules)."""

    def drafter(self, spec: Spec) -> dict[str, Any] | None: ...

    def pair_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]: ...

    def weight_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]: ...
_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.")


class _Mismatch:
    """Collects config-vs-weights problems for one checkpoint, at most one per config key."""

    def __init__(self, key: str, ckpt: Path, shapes: dict[str, tuple[str, list[int]]], cfg: dict[str, Any],
                 cfg_name: str = CONFIG):
        self.key, self.ckpt, self.shapes, self.cfg, self.cfg_name = key, str(ckpt), shapes, cfg, cfg_name
        self.problems: dict[str, Problem] = {}

    def find(self, suffix: str) -> str | None:
        """The tensor named `suffix`, with or without the `model.` prefix."""
        for name in (suffix, f"model.{suffix}"):
            if name in self.shapes:
                return name
        return None

    def shape(self, tensor: str, want: list[int | None], keys: list[str]) -> None:
        """`tensor` must have shape `want` (None: any size); the first disagreeing dim blames `keys[i]`."""
        file, got = self.shapes[tensor]
        bad = [i for i, w in enumerate(want) if len(got) != len(want) or (w is not None and got[i] != w)]
        if bad:
            shown = [w if w is not None else "*" for w in want]
            self.report(keys[bad[0]], f"{tensor} in {file} has shape {got}, the config gives {shown}")

    def report(self, config_key: str, evidence: str) -> None:
        if config_key not in self.problems:
            value = f" = {self.cfg[config_key]}" if config_key in self.cfg else ""
            self.problems[config_key] = Problem(
                self.key, self.ckpt, f"{self.cfg_name} {config_key}{value} disagrees with the weights: {evidence}",
                f"correct {config_key} in {self.cfg_name}, or point {self.key} at the weights it belongs to")


def _problem(key: str, where: Path, exc: ModelError) -> Problem:
    return Problem(key, str(where), exc.message, exc.hint or "")


def llama_weight_problems(key: str, ckpt: Path, cfg: ModelConfig, *, head: bool = False) -> list[Problem]:
    """config.json vs the weights of a Llama checkpoint (`head`: an EAGLE head, one decoder layer over
    [embedding, feature] with no embedding of its own). [] when the weights cannot be sized (.bin)."""
    try:
        shapes = weight_shapes(ckpt)
    except ModelError as exc:
        return [_problem(key, ckpt, exc)]
    if shapes is None:
        return []
    m = _Mismatch(key, ckpt, shapes, cfg.raw)
    k = ModelConfig.key
    V, H = cfg.vocab_size, cfg.hidden_size
    if (emb := m.find("embed_tokens.weight")) is not None:
        m.shape(emb, [V, H], ["vocab_size", "hidden_size"])
    elif not head:
        m.report("vocab_size", "no model.embed_tokens.weight in the weights")
    if "lm_head.weight" in shapes:
        m.shape("lm_head.weight", [V, H], ["vocab_size", "hidden_size"])
    if head and "fc.weight" in shapes:
        m.shape("fc.weight", [H, 2 * H], ["hidden_size", "hidden_size"])
    if (norm := m.find("norm.weight")) is not None:
        m.shape(norm, [H], ["hidden_size"])
    layers = sorted({int(g.group(1)) for t in shapes if (g := _LAYER.match(t))})
    midlayer = any(t.startswith("midlayer.") for t in shapes)  # EAGLE-3: one layer under another name
    if not midlayer and layers != list(range(cfg.num_layers)):
        contiguous = layers == list(range(len(layers)))
        held = (f"layers {layers[0]}..{layers[-1]}" if contiguous else f"layers {layers}") if layers else "none"
        m.report(k("num_layers"), f"the weights hold {len(layers)} decoder layer(s) ({held})")
    prefix = "model." if any(t.startswith("model.layers.") for t in shapes) else ""
    heads_key, kv_key = k("num_heads"), k("num_kv_heads")  # x head_dim: the projections' rows
    for i in layers:
        attn, mlp = f"{prefix}layers.{i}.self_attn.", f"{prefix}layers.{i}.mlp."
        for t, want, keys in ((attn + "q_proj.weight", [cfg.q_size, H], [heads_key, "hidden_size"]),
                              (attn + "k_proj.weight", [cfg.kv_size, H], [kv_key, "hidden_size"]),
                              (attn + "v_proj.weight", [cfg.kv_size, H], [kv_key, "hidden_size"]),
                              (attn + "o_proj.weight", [H, cfg.q_size], ["hidden_size", heads_key]),
                              (mlp + "gate_proj.weight", [cfg.intermediate_size, H],
                               ["intermediate_size", "hidden_size"])):
            if t in shapes:
                m.shape(t, want, keys)
    return list(m.problems.values())


def medusa_weight_problems(key: str, heads_dir: Path, target: ModelConfig) -> list[Problem]:
    """config.json (medusa_num_heads, medusa_num_layers, hidden/vocab size) vs medusa_lm_head.safetensors."""
    try:
        cfg = layouts.medusa_config(heads_dir)
    except ModelError:
        return []  # no usable medusa_num_heads: reported by check_pair itself
    try:
        shapes = weight_shapes(heads_dir, layouts.MEDUSA_WEIGHTS)
    except ModelError as exc:
        return [_problem(key, heads_dir, exc)]
    if shapes is None:
        return []  # no weights file: reported by check_pair itself
    m = _Mismatch(key, heads_dir, shapes, cfg.raw)
    nh, nl = cfg.num_heads, cfg.num_layers
    H, V = cfg.hidden_size or target.hidden_size, cfg.vocab_size or target.vocab_size
    heads = sorted({int(t.split(".", 1)[0]) for t in shapes if t.split(".", 1)[0].isdigit()})
    if len(heads) != nh:
        m.report("medusa_num_heads", f"{layouts.MEDUSA_WEIGHTS} holds {len(heads)} head(s)")
    for h in heads:
        layers = sorted({int(t.split(".")[1]) for t in shapes if re.fullmatch(rf"{h}\.\d+\.linear\.weight", t)})
        if len(layers) != nl or f"{h}.{nl}.weight" not in shapes:
            m.report("medusa_num_layers", f"head {h} has {len(layers)} linear layer(s)"
                     + ("" if f"{h}.{nl}.weight" in shapes else f" and no {h}.{nl}.weight (its LM head)"))
            continue
        for layer in layers:
            m.shape(f"{h}.{layer}.linear.weight", [H, H], ["hidden_size", "hidden_size"])
        m.shape(f"{h}.{nl}.weight", [V, H], ["vocab_size", "hidden_size"])
    return list(m.problems.values())


@dataclasses.dataclass
class PairReport:
    target: dict[str, Any]
    drafter: dict[str, Any] | None
    problems: list[Problem]

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "drafter": self.drafter, "problems": [str(p) for p in self.problems]}


def check_pair(spec: Spec, method: Drafter) -> PairReport:
    """Every problem between the spec's target and its drafter, `method` the spec's (empty list: they fit)."""
    problems: list[Problem] = []
    target = Path(spec.model.target)
    raw = read_json_object(target / CONFIG, "checkpoint")
    archs = raw.get("architectures") or ["?"]
    arch = archs[0] if isinstance(archs, list) else archs
    tok_fp = tokenizer.fingerprint(spec.tokenizer_dir)
    if tok_fp is None:
        problems.append(Problem("model.tokenizer", str(spec.tokenizer_dir), "no tokenizer.json found",
                                "point model.tokenizer (or model.target) at a dir with an HF fast tokenizer"))
    if arch not in SUPPORTED_ARCHITECTURES:  # nothing else of a config we cannot run is worth checking
        problems.insert(0, Problem("model.target", str(target), f"architecture {arch} is not supported",
                                   f"use one of {', '.join(SUPPORTED_ARCHITECTURES)}"))
        return PairReport(target=summary(raw), drafter=None, problems=problems)
    tgt = ModelConfig.from_dir(target)
    need = spec.limits.max_seq_len + spec.speculative.num_draft_tokens
    if need > tgt.max_position_embeddings:
        problems.insert(0, Problem("limits.max_output_len", spec.limits.max_output_len,
                                   f"max_input_len + max_output_len + num_draft_tokens = {need} exceeds the target's "
                                   f"max_position_embeddings ({tgt.max_position_embeddings})",
                                   "lower limits.max_input_len / limits.max_output_len"))
    drafter = method.drafter(spec)
    problems += method.pair_problems(spec, tgt)  # the drafter vs the target: trtspec/methods/<name>.py
    problems.extend(weight_problems(spec, method, tgt))
    return PairReport(target=summary(raw), drafter=drafter, problems=problems)


def weight_problems(spec: Spec, method: Drafter, tgt: ModelConfig | None = None) -> list[Problem]:
    """config.json vs the weights (safetensors headers) of every checkpoint the spec serves: target, and draft or
    heads (`method`: the spec's). Checkpoints that are not there are skipped (check_paths reports them; CI jobs
    may hold only converted checkpoints)."""
    target = Path(spec.model.target)
    if not (target / CONFIG).is_file():
        return []
    tgt = tgt or ModelConfig.from_dir(target)
    out = llama_weight_problems("model.target", target, tgt)
    return out + method.weight_problems(spec, tgt)
