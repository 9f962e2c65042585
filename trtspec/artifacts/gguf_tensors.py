"""The tensors of a GGUF import, streamed: one GGUF file or llama.cpp's split files in, one safetensors file out.

A model's GGUF may come whole or as llama.cpp's split files (`NAME-00001-of-00003.gguf` ..., written by
`llama-gguf-split`; every part carries `split.no` (0-based), `split.count` and `split.tensors.count`, the first
part also the model's key/values). `parts` finds and checks every part; a missing or foreign part is one error
naming it.

The weights never sit in memory whole: each tensor is dequantized a block of rows at a time with the `gguf`
package's `gguf.quants.dequantize` (F32, F16, BF16, Q4_0 ... Q8_0 and the K-quants Q2_K ... Q6_K), cast to the
written dtype and appended to the safetensors file, whose header is known beforehand (names from transformers'
GGUF name map, shapes from the model built on the meta device). The names and the per-architecture fix-ups
(llama's Q/K row order, ...) are transformers' own (`transformers/modeling_gguf_pytorch_utils.py`), so the
checkpoint equals what `from_pretrained(..., gguf_file=...)` loads. A fix-up needs the whole tensor, so only a
tensor that has one is dequantized whole (llama's q/k projections). Import peaks at about one row block plus
the largest such tensor above the Python process, not at the model's float32 size.
"""

from __future__ import annotations

import json
import mmap
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from trtspec.errors import ConvertError

SPLIT = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
BLOCK_BYTES = 64 << 20  # float32 bytes dequantized at a time
ST_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
ALIGN = 8


def parts(src: Path) -> list[Path]:
    """`src` alone, or every file of the split set whose first part it is (in order, all present)."""
    m = SPLIT.match(src.name)
    if m is None:
        return [src]
    count = int(m["count"])
    if int(m["no"]) != 1:
        first = src.with_name(f"{m['stem']}-00001-of-{m['count']}.gguf")
        raise ConvertError(f"{src}: part {int(m['no'])} of a split GGUF", hint=f"pass its first part, {first.name}")
    files = [src.with_name(f"{m['stem']}-{i:05d}-of-{m['count']}.gguf") for i in range(1, count + 1)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ConvertError(f"{src}: split GGUF part {missing[0]} is missing ({len(missing)} of {count} missing)",
                           hint="put every part of the split model in the same directory")
    return files


def readers(files: list[Path]) -> list[Any]:
    """A GGUFReader per part, after checking each part's `split.*` keys against its place in the set."""
    from gguf import GGUFReader

    out = []
    for i, f in enumerate(files):
        try:
            with open(f, "rb") as fh:
                if fh.read(4) != b"GGUF":
                    raise ValueError("no GGUF magic")
            r = GGUFReader(str(f))
        except Exception as exc:  # gguf raises ValueError/struct.error/... for damaged files
            text = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise ConvertError(f"{f}: cannot read it as GGUF ({text})",
                               hint="the file is damaged or truncated: download it again") from None
        if len(files) > 1:
            no, count = field(r, "split.no"), field(r, "split.count")
            if no != i or count != len(files):
                raise ConvertError(f"{f}: its split keys say part {no} of {count}, expected part {i} of {len(files)}"
                                   " (0-based)", hint="the split set mixes files of different models or splits")
        out.append(r)
    if len(files) > 1:
        want, have = field(out[0], "split.tensors.count"), sum(len(r.tensors) for r in out)
        if want is not None and want != have:
            raise ConvertError(f"{files[0]}: the split set holds {have} tensors, its first part says {want}",
                               hint="a part is damaged or from another split: download the parts again")
    return out


def field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return None
    try:
        return f.contents()
    except Exception:  # a field type this gguf version cannot render
        return None


def names(model: Any, architecture: str, config: dict[str, Any]) -> tuple[dict[str, str], Any]:
    """(GGUF tensor name -> HF parameter name, transformers' tensor processor) for a meta-device `model`."""
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        TensorProcessor,
        get_gguf_hf_weights_map,
    )

    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config)
    return get_gguf_hf_weights_map(model, processor), processor


def write(rs: list[Any], path: Path, dtype: str, mapping: dict[str, str], shapes: dict[str, list[int]],
          processor: Any, progress: Callable[[int, int], None]) -> dict[str, list[int]]:
    """Stream every mapped tensor of the readers `rs` into the safetensors file `path`; returns {name: shape}."""
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor

    todo = [(r, t, mapping[t.name]) for r in rs for t in r.tensors if t.name in mapping]
    unmapped = [t.name for r in rs for t in r.tensors if t.name not in mapping]
    if any(n.endswith(".weight") and ".ffn_" in n and "exps" in n for n in unmapped):
        raise ConvertError(f"{path.name}: mixture-of-experts GGUF tensors ({unmapped[0]}) cannot be streamed",
                           hint="import a dense model")
    whole = type(processor) is not TensorProcessor
    st = ST_DTYPES[dtype]
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset, size = 0, 2 if dtype != "float32" else 4
    for _, t, hf in todo:
        shape = shapes.get(hf)
        if shape is None:
            raise ConvertError(f"{t.name} maps to {hf}, which the model does not have",
                               hint="the GGUF's architecture does not match its tensors")
        if int(np.prod(shape)) != int(t.n_elements):
            raise ConvertError(f"{t.name}: {int(t.n_elements)} values, but {hf} has shape {shape}",
                               hint="the GGUF's key/values do not match its tensors")
        nbytes = int(np.prod(shape)) * size
        header[hf] = {"dtype": st, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % ALIGN)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for i, (r, t, hf) in enumerate(todo):
            start = f.tell()
            blocks = _blocks(t, whole and _fixed(processor, t.name), processor, mapping)
            f.writelines(_cast(block, dtype) for block in blocks)
            if f.tell() - start != header[hf]["data_offsets"][1] - header[hf]["data_offsets"][0]:
                raise ConvertError(f"{t.name}: wrote {f.tell() - start} bytes for {hf}, expected "
                                   f"{header[hf]['data_offsets'][1] - header[hf]['data_offsets'][0]}",
                                   hint="report this GGUF: its tensor layout is one the importer does not know")
            _release(r)
            progress(i + 1, len(todo))
    return {hf: header[hf]["shape"] for _, _, hf in todo}


def _fixed(processor: Any, name: str) -> bool:
    """Whether transformers' processor may change this tensor (it then needs the whole tensor at once)."""
    probe = np.zeros((2, 2), dtype=np.float32)
    try:
        out = processor.process(weights=probe, name=name, tensor_key_mapping={}, parsed_parameters={"tensors": {}})
    except Exception:  # a fix-up that needs the real shape: treat it as changing the tensor
        return True
    return out.weights is not probe or out.name != name


def _blocks(t: Any, whole: bool, processor: Any, mapping: dict[str, str]):
    """float32 numpy blocks of `t`'s values in row-major order of its HF shape."""
    from gguf import dequantize

    data = t.data
    if whole:
        values = dequantize(data, t.tensor_type)
        out = processor.process(weights=values, name=t.name, tensor_key_mapping=mapping,
                                parsed_parameters={"tensors": {}})
        yield np.ascontiguousarray(out.weights, dtype=np.float32)
        return
    rows = data.reshape(-1, data.shape[-1]) if data.ndim > 1 else data.reshape(1, -1)
    per_row = max(1, int(t.n_elements) // rows.shape[0]) * 4
    step = max(1, BLOCK_BYTES // per_row)
    for lo in range(0, rows.shape[0], step):
        yield np.ascontiguousarray(dequantize(np.array(rows[lo:lo + step]), t.tensor_type), dtype=np.float32)


def _cast(block: np.ndarray, dtype: str) -> memoryview:
    import torch

    t = torch.from_numpy(block).reshape(-1)
    if dtype != "float32":
        t = t.to(getattr(torch, dtype))
    return memoryview(t.view(torch.uint8).numpy())


def _release(reader: Any) -> None:
    """Drop the pages of the GGUF mapping read so far from this process (they stay in the page cache)."""
    m = getattr(getattr(reader, "data", None), "_mmap", None)
    if m is not None and hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        try:
            m.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):
            pass
