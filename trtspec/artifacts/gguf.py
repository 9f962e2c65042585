"""GGUF -> Hugging Face checkpoint: `trtspec models import SRC.gguf --out DIR [--dtype ...]`.

A GGUF file (llama.cpp's format: quantized tensors, the config as key/values, the tokenizer and its chat
template) becomes a checkpoint dir every trtspec consumer reads: `model.safetensors`, `config.json`,
`generation_config.json`, `tokenizer.json` + `tokenizer_config.json` (with the chat template) and the
manifest `trtspec.import.json` (source sha256, tensors, dtype, tool versions).

The key/values are read by transformers' own GGUF code (config mapping, tokenizer reconstruction), so an
import equals what `from_pretrained(..., gguf_file=...)` would run from the file; the tensors are streamed
(`gguf_tensors`: dequantized through the `gguf` package a block of rows at a time and appended to the
safetensors file), so the import needs about the memory of one block, not the model's float32 size. llama.cpp's
split files (`NAME-00001-of-0000N.gguf`) import from their first part. Tied LM heads are stored once, as
transformers does; float32 keeps the GGUF's dequantized values exactly, other dtypes are a cast of them.

The output dir appears complete or not at all (`fs.atomic_dir`); importing the same file with the same
dtype again finds the manifest and the files unchanged and writes nothing (idempotent); a dir that is not
an import of this file is replaced only with `force`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trtspec.artifacts import fs, gguf_tensors, manifest
from trtspec.artifacts.weights import MODEL_WEIGHTS
from trtspec.errors import ConvertError

FORMAT = 1
DTYPES = ("float32", "bfloat16", "float16")
MAGIC = b"GGUF"
# Keys of a GGUF whose token ids also end a reply (Llama 3's <|eot_id|>, ...): the generation config's EOS.
EOS_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
# Keys of a GGUF-loaded config that describe the GGUF loading, not the checkpoint written.
NOT_CONFIG = ("quantization_config",)
# Loader arguments transformers 5 echoes into a saved tokenizer_config.json.
NOT_TOKENIZER_CONFIG = ("is_local", "local_files_only", "gguf_file", "trust_remote_code")
Report = Callable[[str, int, int], None]  # (phase, done, total)


def _quiet(phase: str, done: int, total: int) -> None:
    pass


def import_gguf(src: str | Path, out: str | Path, dtype: str = "float32", *, force: bool = False,
                report: Report = _quiet) -> dict[str, Any]:
    """Import `src` into the checkpoint dir `out`; returns the manifest (`"skipped": True` when `out`
    already holds this import)."""
    src, out = Path(src), Path(out)
    if dtype not in DTYPES:
        raise ConvertError(f"unsupported dtype {dtype!r}", hint=f"use one of {', '.join(DTYPES)}")
    _check_gguf(src)
    files = gguf_tensors.parts(src)
    report("hash", 0, 1)
    source = _source(files)
    report("hash", 1, 1)
    existing = manifest.read(out / manifest.FILE_NAMES[manifest.IMPORT], manifest.IMPORT)
    if existing and _same_import(existing, source, dtype) and not fs.tree_changes(out, _recorded(existing),
                                                                                  exclude=_manifest_names()):
        return {**existing, "skipped": True}
    if out.is_dir() and any(out.iterdir()) and not force:
        what = "an import of another file or dtype, or was changed" if existing else "not a trtspec import"
        raise ConvertError(f"{out} exists and is {what}", hint="pass --force to replace it, or choose another --out")
    if out.exists() and not out.is_dir():
        raise ConvertError(f"{out} exists and is not a directory", hint="choose another --out")

    with fs.atomic_dir(out) as tmp:
        info = _write(files, tmp, dtype, report)
        report("manifest", 0, 1)
        m = manifest.new(manifest.IMPORT, FORMAT, inputs={"source": source, "gguf": info["gguf"]},
                         outputs=manifest.file_table(tmp), versions={**fs.tool_versions(), "gguf": _version("gguf")},
                         dtype=dtype, tensors=info["tensors"])
        manifest.write(tmp / manifest.FILE_NAMES[manifest.IMPORT], m)
        report("manifest", 1, 1)
    return m


def _check_gguf(src: Path) -> None:
    try:
        with open(src, "rb") as f:
            head = f.read(4)
    except FileNotFoundError:
        raise ConvertError(f"{src}: not found", hint="pass the path of a .gguf file") from None
    except IsADirectoryError:
        raise ConvertError(f"{src}: is a directory", hint="pass the path of a .gguf file") from None
    except OSError as exc:
        raise ConvertError(f"{src}: cannot read it ({exc.strerror or exc})",
                           hint="check the file's permissions") from None
    if head != MAGIC:
        raise ConvertError(f"{src}: not a GGUF file (no GGUF magic)", hint="pass a llama.cpp .gguf model file")


def _source(files: list[Path]) -> dict[str, Any]:
    """The manifest's record of the source: name, sha256 and bytes of the file, or of the split set read in order
    (each part listed)."""
    import hashlib

    whole, each, buf = hashlib.sha256(), [], bytearray(1 << 18)
    for f in files:
        part = hashlib.sha256()
        with open(f, "rb") as fh:
            while n := fh.readinto(buf):
                part.update(memoryview(buf)[:n])
                whole.update(memoryview(buf)[:n])
        each.append({"name": f.name, "sha256": part.hexdigest(), "bytes": f.stat().st_size})
    source = {"name": files[0].name, "sha256": whole.hexdigest(), "bytes": sum(p["bytes"] for p in each)}
    return {**source, "parts": each} if len(files) > 1 else source


def _same_import(m: dict[str, Any], source: dict[str, Any], dtype: str) -> bool:
    src = (m.get("inputs") or {}).get("source") or {}
    return m.get("format") == FORMAT and m.get("dtype") == dtype and src.get("sha256") == source["sha256"]


def _recorded(m: dict[str, Any]) -> dict[str, str]:
    return {rel: v.get("sha256", "") for rel, v in (m.get("outputs") or {}).items() if isinstance(v, dict)}


def _manifest_names() -> tuple[str, ...]:
    return tuple(manifest.FILE_NAMES.values())


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def _write(files: list[Path], out: Path, dtype: str, report: Report) -> dict[str, Any]:
    """Read the GGUF `files` (one, or a split set), write the checkpoint files into `out`; returns manifest
    details."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the caller's `report` shows progress

    src = files[0]
    where, name = str(src.parent), src.name
    kw = {"gguf_file": name, "local_files_only": True, "trust_remote_code": False}
    rs = gguf_tensors.readers(files)
    report("tokenizer", 0, 1)
    tok = _guard(lambda: AutoTokenizer.from_pretrained(where, **kw), src, "its tokenizer")
    tok.save_pretrained(out, save_jinja_files=False)  # the chat template inside tokenizer_config.json
    _clean_tokenizer_config(out / "tokenizer_config.json")
    report("tokenizer", 1, 1)
    cfg = _guard(lambda: AutoConfig.from_pretrained(where, **kw), src, "its config")
    arch = gguf_tensors.field(rs[0], "general.architecture")
    all_names = {t.name for r in rs for t in r.tensors}
    if len(rs) > 1 and arch not in ("falcon", "bloom"):  # transformers looks for the head in the first part only
        cfg.tie_word_embeddings = "output.weight" not in all_names
    with torch.device("meta"):  # names and shapes only, no memory
        meta = _guard(lambda: AutoModelForCausalLM.from_config(cfg, dtype=torch.float32), src, "the model")
    mapping, processor = _guard(lambda: gguf_tensors.names(meta, arch, cfg.to_dict()), src, "its tensor names")
    tied = bool(getattr(cfg, "tie_word_embeddings", False))
    params = {k: list(v.shape) for k, v in meta.state_dict().items()}
    want = {k for k in params if not (tied and k == "lm_head.weight")}  # a tied head is the embedding, once
    missing = sorted(want - {mapping[n] for n in all_names if n in mapping})
    if missing:
        raise ConvertError(f"{src}: the GGUF has no tensor for {missing[0]} ({len(missing)} missing)",
                           hint="the file is incomplete or not the architecture its key/values name")
    del meta
    written = gguf_tensors.write(rs, out / MODEL_WEIGHTS, dtype, mapping, params,
                                 processor, lambda done, total: report("convert", done, total))

    meta = _metadata(rs)
    cfg.architectures = [cfg.architectures[0] if cfg.architectures else _arch_class(cfg.model_type)]
    cfg.dtype = dtype
    raw = {k: v for k, v in cfg.to_diff_dict().items() if not k.startswith("_") and k not in NOT_CONFIG}
    eos = _eos_ids(meta, raw.get("eos_token_id"))
    raw["eos_token_id"] = eos[0] if len(eos) == 1 else (eos or None)
    fs.write_json(out / "config.json", raw)
    gen = GenerationConfig(bos_token_id=raw.get("bos_token_id"), eos_token_id=raw["eos_token_id"],
                           pad_token_id=raw.get("pad_token_id"))
    fs.write_json(out / "generation_config.json", gen.to_diff_dict())
    return {"gguf": meta, "tensors": {"count": len(written),
                                      "parameters": sum(int(_numel(s)) for s in written.values()),
                                      "names": written}}


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _clean_tokenizer_config(path: Path) -> None:
    data = fs.read_json(path) or {}
    fs.write_json(path, {k: v for k, v in data.items() if k not in NOT_TOKENIZER_CONFIG})


def _arch_class(model_type: str) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type, f"{model_type}ForCausalLM")


def _metadata(rs: list[Any]) -> dict[str, Any]:
    """What the manifest records of the source: architecture, name, file type, the tensor types, EOS ids."""
    from collections import Counter

    def field(key: str):
        return gguf_tensors.field(rs[0], key)

    types = Counter(t.tensor_type.name for r in rs for t in r.tensors)
    return {"architecture": field("general.architecture"), "name": field("general.name"),
            "file_type": field("general.file_type"), "tensor_types": dict(sorted(types.items())),
            "eos_token_ids": [int(v) for v in (field(k) for k in EOS_KEYS) if isinstance(v, int)],
            **({"split_count": len(rs)} if len(rs) > 1 else {})}


def _eos_ids(meta: dict[str, Any], cfg_eos: Any) -> list[int]:
    first = [int(e) for e in cfg_eos] if isinstance(cfg_eos, list) else ([] if cfg_eos is None else [int(cfg_eos)])
    return list(dict.fromkeys(first + meta["eos_token_ids"]))


def _guard(load, src: Path, what: str):
    try:
        return load()
    except ImportError as exc:
        raise ConvertError(f"{src}: cannot read {what}: {exc}",
                           hint="install trtspec's dependencies (`make install`: gguf and accelerate)") from None
    except Exception as exc:  # transformers raises ValueError/KeyError/... for files it cannot map
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ConvertError(f"{src}: transformers cannot read {what}: {text}",
                           hint="the GGUF's architecture or tokenizer is not one transformers can load") from None
