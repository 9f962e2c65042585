"""Pair validation: does the drafter fit the target? (tokenizer, vocab, lengths, heads)

Reads only `config.json` and tokenizer files, so it is fast and needs no torch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from trtspec.errors import ModelError
from trtspec.spec import Problem, Spec, check_heads_depth

TOKENIZER_FILES = ("tokenizer.json",)
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


def read_config(ckpt: Path) -> dict[str, Any]:
    path = Path(ckpt) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelError(f"no config.json in {ckpt}", hint="point the spec at a Hugging Face checkpoint dir") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}: invalid JSON: {exc}", hint="re-export the checkpoint") from None


def tokenizer_fingerprint(tok_dir: Path) -> str | None:
    """sha256 of the tokenizer's vocabulary + merges + special tokens (None if no tokenizer.json)."""
    path = Path(tok_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    model = data.get("model", {})
    essence = {"vocab": model.get("vocab"), "merges": model.get("merges"), "type": model.get("type"),
               "added": [(t.get("id"), t.get("content")) for t in data.get("added_tokens", [])]}
    return hashlib.sha256(json.dumps(essence, sort_keys=True).encode()).hexdigest()


@dataclasses.dataclass
class PairReport:
    target: dict[str, Any]
    drafter: dict[str, Any] | None
    problems: list[Problem]

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "drafter": self.drafter, "problems": [str(p) for p in self.problems]}


def _summary(cfg: dict[str, Any]) -> dict[str, Any]:
    keys = ("architectures", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "torch_dtype", "medusa_num_heads")
    return {k: cfg[k] for k in keys if k in cfg}


def check_pair(spec: Spec) -> PairReport:
    """Every problem between the spec's target and its drafter (empty list: they fit)."""
    problems: list[Problem] = []
    tgt = read_config(spec.model.target)
    arch = (tgt.get("architectures") or ["?"])[0]
    if arch not in SUPPORTED_ARCHITECTURES:
        problems.append(Problem("model.target", str(spec.model.target), f"architecture {arch} is not supported",
                                f"use one of {', '.join(SUPPORTED_ARCHITECTURES)}"))
    max_pos = tgt.get("max_position_embeddings")
    need = spec.limits.max_seq_len + spec.speculative.num_draft_tokens
    if max_pos and need > max_pos:
        problems.append(Problem("limits.max_output_len", spec.limits.max_output_len,
                                f"max_input_len + max_output_len + num_draft_tokens = {need} exceeds the target's "
                                f"max_position_embeddings ({max_pos})",
                                "lower limits.max_input_len / limits.max_output_len"))
    tok_fp = tokenizer_fingerprint(spec.tokenizer_dir)
    if tok_fp is None:
        problems.append(Problem("model.tokenizer", str(spec.tokenizer_dir), "no tokenizer.json found",
                                "point model.tokenizer (or model.target) at a dir with an HF fast tokenizer"))
    drafter = None
    s = spec.speculative
    if s.method == "draft-model" and s.draft is not None:
        dcfg = read_config(s.draft)
        drafter = _summary(dcfg)
        if dcfg.get("vocab_size") != tgt.get("vocab_size"):
            problems.append(Problem("speculative.draft", str(s.draft),
                                    f"vocab_size {dcfg.get('vocab_size')} differs from the target's {tgt.get('vocab_size')}",
                                    "use a draft trained with the target's tokenizer"))
        d_fp = tokenizer_fingerprint(s.draft)
        if d_fp is not None and tok_fp is not None and d_fp != tok_fp:
            problems.append(Problem("speculative.draft", str(s.draft), "its tokenizer differs from the target's",
                                    "draft and target must share one tokenizer (same vocab and merges)"))
        dmax = dcfg.get("max_position_embeddings")
        if dmax and need > dmax:
            problems.append(Problem("speculative.draft", str(s.draft),
                                    f"draft max_position_embeddings ({dmax}) < the sequence length needed ({need})",
                                    "lower the limits or use a draft with longer positions"))
    elif s.method in ("medusa", "eagle") and s.heads is not None:
        hcfg = read_config(s.heads)
        drafter = _summary(hcfg)
        if hcfg.get("hidden_size") != tgt.get("hidden_size"):
            problems.append(Problem("speculative.heads", str(s.heads),
                                    f"hidden_size {hcfg.get('hidden_size')} differs from the target's "
                                    f"{tgt.get('hidden_size')}", "use heads trained on this target"))
        if hcfg.get("vocab_size", tgt.get("vocab_size")) != tgt.get("vocab_size"):
            problems.append(Problem("speculative.heads", str(s.heads),
                                    f"vocab_size {hcfg.get('vocab_size')} differs from the target's "
                                    f"{tgt.get('vocab_size')}", "use heads trained on this target"))
        if s.method == "medusa":
            heads = hcfg.get("medusa_num_heads")
            if not heads:
                problems.append(Problem("speculative.heads", str(s.heads), "config.json has no medusa_num_heads",
                                        "point speculative.heads at a Medusa heads dir"))
            else:
                problems.extend(check_heads_depth(spec, int(heads)))
            if not (Path(s.heads) / "medusa_lm_head.safetensors").is_file():
                problems.append(Problem("speculative.heads", str(s.heads), "no medusa_lm_head.safetensors",
                                        "export the heads as medusa_lm_head.safetensors"))
    return PairReport(target=_summary(tgt), drafter=drafter, problems=problems)
