"""Pair validation: does the drafter fit the target? (tokenizer, vocab, lengths, heads), and does each
checkpoint's config.json describe its own weights (vocab, hidden size, layers, heads)?

Reads only `config.json`, tokenizer files and the safetensors *headers* (tensor names and shapes,
never the tensors), so it is fast and needs no torch: a config that disagrees with its weights is
reported here instead of failing, or silently misbehaving, when the server loads the model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import struct
from pathlib import Path
from typing import Any

from trtspec.errors import ModelError
from trtspec.spec import Problem, Spec, check_heads_depth

TOKENIZER_FILES = ("tokenizer.json",)
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in `path` (a checkpoint's config.json, tokenizer.json ...); a ModelError naming the file
    when it is not UTF-8, not JSON or not an object (callers index it as a dict)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ModelError(f"{path}: not UTF-8 text", hint=f"re-export the {what} (JSON files are UTF-8)") from None
    except json.JSONDecodeError as exc:
        raise ModelError(f"{path}: invalid JSON: {exc}", hint=f"re-export the {what}") from None
    except OSError as exc:
        raise ModelError(f"{path}: cannot read it ({exc.strerror or exc})",
                         hint="check the file's permissions") from None
    if not isinstance(data, dict):
        raise ModelError(f"{path}: holds a JSON {_json_type(data)}, not an object",
                         hint=f"re-export the {what}: it must be one JSON object {{...}}")
    return data


def _json_type(value: Any) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def read_config(ckpt: Path) -> dict[str, Any]:
    path = Path(ckpt) / "config.json"
    if not path.is_file():
        raise ModelError(f"no config.json in {ckpt}", hint="point the spec at a Hugging Face checkpoint dir")
    return read_json_object(path, "checkpoint")


def tokenizer_fingerprint(tok_dir: Path) -> str | None:
    """sha256 of the tokenizer's vocabulary + merges + special tokens (None if no tokenizer.json)."""
    path = Path(tok_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    data = read_json_object(path, "tokenizer")
    model = data.get("model")
    model = model if isinstance(model, dict) else {}
    added = data.get("added_tokens")
    essence = {"vocab": model.get("vocab"), "merges": model.get("merges"), "type": model.get("type"),
               "added": [(t.get("id"), t.get("content")) for t in (added if isinstance(added, list) else [])
                         if isinstance(t, dict)]}
    return hashlib.sha256(json.dumps(essence, sort_keys=True).encode()).hexdigest()


MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header


def safetensors_header(path: Path) -> dict[str, Any]:
    """{tensor name: {"dtype", "shape", ...}} from a safetensors file's JSON header (nothing else is read)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ValueError("shorter than its 8-byte header length")
            (n,) = struct.unpack("<Q", raw)
            if n > min(MAX_HEADER, path.stat().st_size - 8):
                raise ValueError(f"header length {n} does not fit the file")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError("header is not a JSON object")
    except (OSError, ValueError) as exc:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelError(f"{path}: not a readable safetensors file ({exc})", hint="re-export the checkpoint") from None
    return {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}


def weight_shapes(ckpt: Path, filename: str = "model.safetensors") -> dict[str, tuple[str, list[int]]] | None:
    """{tensor name: (file name, shape)} of a checkpoint's weights as the runtime loads them: `filename`, or
    the shards of `<filename>.index.json`. None when there are no such safetensors (e.g. .bin weights,
    which the build converts and only loading could size). ModelError when a file is unreadable."""
    ckpt = Path(ckpt)
    single, index = ckpt / filename, ckpt / f"{filename}.index.json"
    if single.is_file():
        files = [filename]
    elif index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ModelError(f"{index}: not a safetensors index ({exc})", hint="re-export the checkpoint") from None
        missing = [f for f in files if not (ckpt / f).is_file()]
        if missing:
            raise ModelError(f"{index} lists {missing[0]}, which is missing", hint="copy every shard of the checkpoint")
    else:
        return None
    out: dict[str, tuple[str, list[int]]] = {}
    for name in files:
        for tensor, info in safetensors_header(ckpt / name).items():
            out[tensor] = (name, [int(d) for d in info.get("shape", [])])
    return out


_LAYER = re.compile(r"^(?:model\.)?layers\.(\d+)\.")


class _Mismatch:
    """Collects config-vs-weights problems for one checkpoint, at most one per config key."""

    def __init__(self, key: str, ckpt: Path, shapes: dict[str, tuple[str, list[int]]], cfg: dict[str, Any],
                 cfg_name: str = "config.json"):
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


def _llama_dims(cfg: dict[str, Any]) -> dict[str, int] | None:
    try:
        h, nh = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        nkv = int(cfg.get("num_key_value_heads") or nh)
        return {"vocab_size": int(cfg["vocab_size"]), "hidden_size": h, "num_attention_heads": nh,
                "num_key_value_heads": nkv, "head_dim": int(cfg.get("head_dim") or h // nh),
                "num_hidden_layers": int(cfg["num_hidden_layers"]),
                "intermediate_size": int(cfg.get("intermediate_size") or 0)}
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None  # a config this incomplete fails elsewhere, with its own message


def llama_weight_problems(key: str, ckpt: Path, cfg: dict[str, Any], *, head: bool = False) -> list[Problem]:
    """config.json vs the weights of a Llama checkpoint (`head`: an EAGLE head, one decoder layer over
    [embedding, feature] with no embedding of its own). [] when the weights cannot be sized (.bin)."""
    d = _llama_dims(cfg)
    try:
        shapes = weight_shapes(ckpt)
    except ModelError as exc:
        return [Problem(key, str(ckpt), exc.message, exc.hint or "")]
    if d is None or shapes is None:
        return []
    m = _Mismatch(key, ckpt, shapes, cfg)
    V, H, hd = d["vocab_size"], d["hidden_size"], d["head_dim"]
    q_rows, kv_rows = d["num_attention_heads"] * hd, d["num_key_value_heads"] * hd
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
    if not midlayer and layers != list(range(d["num_hidden_layers"])):
        contiguous = layers == list(range(len(layers)))
        held = (f"layers {layers[0]}..{layers[-1]}" if contiguous else f"layers {layers}") if layers else "none"
        m.report("num_hidden_layers", f"the weights hold {len(layers)} decoder layer(s) ({held})")
    prefix = "model." if any(t.startswith("model.layers.") for t in shapes) else ""
    for i in layers:
        attn, mlp = f"{prefix}layers.{i}.self_attn.", f"{prefix}layers.{i}.mlp."
        heads_key, kv_key = "num_attention_heads", "num_key_value_heads"  # x head_dim: the projections' rows
        for t, want, keys in ((attn + "q_proj.weight", [q_rows, H], [heads_key, "hidden_size"]),
                              (attn + "k_proj.weight", [kv_rows, H], [kv_key, "hidden_size"]),
                              (attn + "v_proj.weight", [kv_rows, H], [kv_key, "hidden_size"]),
                              (attn + "o_proj.weight", [H, q_rows], ["hidden_size", heads_key]),
                              (mlp + "gate_proj.weight", [d["intermediate_size"] or None, H],
                               ["intermediate_size", "hidden_size"])):
            if t in shapes:
                m.shape(t, want, keys)
    return list(m.problems.values())


def medusa_weight_problems(key: str, heads_dir: Path, cfg: dict[str, Any], target: dict[str, Any]) -> list[Problem]:
    """config.json (medusa_num_heads, medusa_num_layers, hidden/vocab size) vs medusa_lm_head.safetensors."""
    try:
        shapes = weight_shapes(heads_dir, "medusa_lm_head.safetensors")
        nh, nl = int(cfg.get("medusa_num_heads") or 0), int(cfg.get("medusa_num_layers") or 1)
        H = int(cfg.get("hidden_size") or target.get("hidden_size") or 0)
        V = int(cfg.get("vocab_size") or target.get("vocab_size") or 0)
    except ModelError as exc:
        return [Problem(key, str(heads_dir), exc.message, exc.hint or "")]
    except (TypeError, ValueError):
        return []
    if shapes is None or nh < 1:
        return []  # missing file / medusa_num_heads: reported by check_pair itself
    m = _Mismatch(key, heads_dir, shapes, cfg)
    heads = sorted({int(t.split(".", 1)[0]) for t in shapes if t.split(".", 1)[0].isdigit()})
    if len(heads) != nh:
        m.report("medusa_num_heads", f"medusa_lm_head.safetensors holds {len(heads)} head(s)")
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


def _summary(cfg: dict[str, Any]) -> dict[str, Any]:
    keys = ("architectures", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "torch_dtype", "medusa_num_heads")
    return {k: cfg[k] for k in keys if k in cfg}


def check_pair(spec: Spec) -> PairReport:
    """Every problem between the spec's target and its drafter (empty list: they fit)."""
    problems: list[Problem] = []
    tgt = read_config(spec.model.target)
    archs = tgt.get("architectures") or ["?"]
    arch = archs[0] if isinstance(archs, list) else archs
    if arch not in SUPPORTED_ARCHITECTURES:
        problems.append(Problem("model.target", str(spec.model.target), f"architecture {arch} is not supported",
                                f"use one of {', '.join(SUPPORTED_ARCHITECTURES)}"))
    max_pos = tgt.get("max_position_embeddings")
    need = spec.limits.max_seq_len + spec.speculative.num_draft_tokens
    if isinstance(max_pos, int) and max_pos and need > max_pos:
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
        if isinstance(dmax, int) and dmax and need > dmax:
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
    if arch in SUPPORTED_ARCHITECTURES:
        problems.extend(weight_problems(spec))
    return PairReport(target=_summary(tgt), drafter=drafter, problems=problems)


def weight_problems(spec: Spec) -> list[Problem]:
    """config.json vs the weights (safetensors headers) of every checkpoint the spec serves: target, draft,
    heads. Checkpoints that are not there are skipped (check_paths reports them; CI jobs may hold only
    converted checkpoints)."""
    s, out = spec.speculative, []
    target = Path(spec.model.target)
    if not (target / "config.json").is_file():
        return []
    tgt = read_config(target)
    out += llama_weight_problems("model.target", target, tgt)
    if s.method == "draft-model" and s.draft is not None and (Path(s.draft) / "config.json").is_file():
        out += llama_weight_problems("speculative.draft", Path(s.draft), read_config(s.draft))
    if s.method in ("medusa", "eagle") and s.heads is not None and (Path(s.heads) / "config.json").is_file():
        hcfg = read_config(s.heads)
        out += (medusa_weight_problems("speculative.heads", Path(s.heads), hcfg, tgt) if s.method == "medusa"
                else llama_weight_problems("speculative.heads", Path(s.heads), hcfg, head=True))
    return out
