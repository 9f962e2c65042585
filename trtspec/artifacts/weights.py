"""Checkpoint weights: the one safetensors loader, and header-only shapes.

A checkpoint's weights are `<name>` (default model.safetensors) or the shards listed in
`<name>.index.json`. `open_weights` reads them one tensor at a time, straight from the file into the tensor's
own buffer (no mmap, whose touched pages would count in the process's RSS until the file is closed, and no
dict of every tensor): a model loader that casts and drops each tensor as it goes never holds the checkpoint
twice. PyTorch pickles (`*.bin`, `*.pt`) are never loaded: a dir that holds only those is
refused with a hint to re-save it as safetensors. `weight_shapes` reads only the JSON headers (tensor names,
dtypes and shapes), so the pair check sizes a multi-GB checkpoint in milliseconds and without torch.

Every function takes the error class of its caller's failure class (ModelError when checking or loading a
model, ConvertError when converting, BuildError when building), so one reader serves them all.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.artifacts.fs import read_json_object
from trtspec.errors import ModelError, TrtspecError

if TYPE_CHECKING:  # torch is imported only where tensors are touched
    import torch

MODEL_WEIGHTS = "model.safetensors"
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header
Error = type[TrtspecError]


def weight_files(ckpt: Path, filename: str = MODEL_WEIGHTS, error: Error = ModelError) -> list[Path]:
    """The files holding `filename`'s tensors: itself, or every shard its index lists (all must exist)."""
    ckpt = Path(ckpt)
    single, index = ckpt / filename, ckpt / f"{filename}.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        weight_map = read_json_object(index, "checkpoint", error).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise error(f"{index}: not a safetensors index (no weight_map of file names)",
                        hint="re-export the checkpoint")
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not (ckpt / f).is_file()]
        if missing:
            raise error(f"{index} lists {missing[0]}, which is missing", hint="copy every shard of the checkpoint")
        return [ckpt / f for f in files]
    if any(ckpt.glob("*.bin")) or any(ckpt.glob("*.pt")):
        raise error(f"{ckpt}: only PyTorch .bin weights found",
                    hint="save the checkpoint as safetensors (save_pretrained(safe_serialization=True))")
    raise error(f"{ckpt}: no {filename} (or {filename}.index.json)",
                hint="point the spec at a checkpoint directory with its weights (the examples' own weights are "
                     "restored by `make install`)")


def has_weights(ckpt: Path, filename: str = MODEL_WEIGHTS) -> bool:
    ckpt = Path(ckpt)
    return (ckpt / filename).is_file() or (ckpt / f"{filename}.index.json").is_file()


def load_file(path: Path, error: Error = ModelError) -> dict[str, "torch.Tensor"]:
    """Every tensor of one safetensors file (on CPU, in its stored dtype)."""
    from safetensors.torch import load_file as _load

    try:
        return _load(str(path))
    except Exception as exc:  # safetensors raises its own error types for every kind of damage
        raise error(f"{path}: cannot read safetensors ({exc})", hint="re-export the checkpoint") from None


# safetensors' dtype names -> torch's (the ones checkpoints use)
_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool"}


class LazyWeights(Mapping):
    """{tensor name: tensor} of a checkpoint (`weight_files`), each tensor read from its file when it is looked
    up, into a fresh CPU tensor in its stored dtype that nothing else holds (see the module docstring). Only
    the JSON headers are read up front."""

    def __init__(self, ckpt: Path, filename: str = MODEL_WEIGHTS, error: Error = ModelError):
        self.error = error
        self.where: dict[str, tuple[Path, int, dict[str, Any]]] = {}
        for f in weight_files(ckpt, filename, error):
            header, data_start = _header(f, error)
            for name, info in header.items():
                self.where[name] = (f, data_start, info)

    def __len__(self) -> int:
        return len(self.where)

    def __iter__(self) -> Iterator[str]:
        return iter(self.where)

    def __contains__(self, name: object) -> bool:
        return name in self.where

    def nbytes(self, name: str) -> int:
        start, end = self.where[name][2]["data_offsets"]
        return int(end) - int(start)

    def __getitem__(self, name: str) -> "torch.Tensor":
        import torch

        path, data_start, info = self.where[name]
        try:
            dtype = getattr(torch, _ST_DTYPES[info["dtype"]])
            shape = [int(d) for d in info["shape"]]
            start, end = (int(x) for x in info["data_offsets"])
            count = 1
            for d in shape:
                count *= d
            if end - start != count * dtype.itemsize or start < 0:
                raise ValueError(f"tensor {name!r}: {end - start} bytes for shape {shape} of {info['dtype']}")
            buf = torch.empty(end - start, dtype=torch.uint8)
            with open(path, "rb") as f:
                f.seek(data_start + start)
                if f.readinto(memoryview(buf.numpy())) != end - start:
                    raise ValueError(f"tensor {name!r} runs past the end of the file")
        except (KeyError, TypeError, ValueError, OSError) as exc:
            raise self.error(f"{path}: not a readable safetensors file ({exc})",
                             hint="re-export the checkpoint") from None
        return buf.view(dtype).view(shape)


def open_weights(ckpt: Path, filename: str = MODEL_WEIGHTS, error: Error = ModelError) -> LazyWeights:
    """A checkpoint's tensors, read one by one as they are looked up (LazyWeights)."""
    return LazyWeights(ckpt, filename, error)


def load_weights(ckpt: Path, filename: str = MODEL_WEIGHTS, error: Error = ModelError) -> dict[str, "torch.Tensor"]:
    """All tensors of a checkpoint dir (`filename` or its shards)."""
    weights: dict[str, torch.Tensor] = {}
    for f in weight_files(ckpt, filename, error):
        weights.update(load_file(f, error))
    return weights


def save_weights(tensors: dict[str, "torch.Tensor"], path: Path) -> None:
    """One safetensors file, contiguous tensors, `format: pt` metadata (what transformers writes)."""
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(path), metadata={"format": "pt"})


def safetensors_header(path: Path, error: Error = ModelError) -> dict[str, dict[str, Any]]:
    """{tensor name: {"dtype", "shape", "data_offsets"}} from a safetensors file's JSON header (nothing
    else is read)."""
    return _header(path, error)[0]


def _header(path: Path, error: Error) -> tuple[dict[str, dict[str, Any]], int]:
    """(the header's tensors, the offset of the data they index from)."""
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
        raise error(f"{path}: not a readable safetensors file ({exc})", hint="re-export the checkpoint") from None
    return {k: v for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)}, 8 + n


def tensor_names(ckpt: Path, filename: str = MODEL_WEIGHTS, error: Error = ModelError) -> list[str]:
    return [name for f in weight_files(ckpt, filename, error) for name in safetensors_header(f, error)]


def weight_shapes(ckpt: Path, filename: str = MODEL_WEIGHTS,
                  error: Error = ModelError) -> dict[str, tuple[str, list[int]]] | None:
    """{tensor name: (file name, shape)} of a checkpoint's weights as they load: None when it has no such
    safetensors (e.g. .bin weights, which only loading could size); `error` when a file is unreadable."""
    if not has_weights(ckpt, filename):
        return None
    out: dict[str, tuple[str, list[int]]] = {}
    for f in weight_files(ckpt, filename, error):
        for tensor, info in safetensors_header(f, error).items():
            out[tensor] = (f.name, [int(d) for d in info.get("shape", [])])
    return out
