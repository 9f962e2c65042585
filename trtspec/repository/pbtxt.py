"""`config.pbtxt` through Triton's own `model_config` protobuf (shipped with tritonclient).

Configs are built as `ModelConfig` messages and written with protobuf's text format; they are
never produced from string templates. `read_config` parses one back (tests do, for every file).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.errors import RepositoryError

ModelConfig = mc.ModelConfig
DataType = mc.DataType

_DTYPES = {
    "BOOL": mc.TYPE_BOOL, "UINT8": mc.TYPE_UINT8, "INT32": mc.TYPE_INT32, "INT64": mc.TYPE_INT64,
    "UINT64": mc.TYPE_UINT64, "FP16": mc.TYPE_FP16, "BF16": mc.TYPE_BF16, "FP32": mc.TYPE_FP32,
    "STRING": mc.TYPE_STRING, "BYTES": mc.TYPE_STRING,
}


def dtype(name: str) -> int:
    """`"INT32"` / `"TYPE_INT32"` -> the DataType enum value."""
    key = name.removeprefix("TYPE_")
    if key not in _DTYPES:
        raise RepositoryError(f"unknown Triton data type {name!r}", hint=f"use one of {sorted(_DTYPES)}")
    return _DTYPES[key]


def tensor(name: str, type_: str, dims: list[int], optional: bool = False, **extra: Any) -> dict[str, Any]:
    """A tensor description for `io()`; kept as plain data so callers can list I/O compactly."""
    return {"name": name, "type": type_, "dims": dims, "optional": optional, **extra}


def add_inputs(config: mc.ModelConfig, tensors: list[dict[str, Any]]) -> None:
    for t in tensors:
        entry = config.input.add(name=t["name"], data_type=dtype(t["type"]), dims=t["dims"])
        if t.get("optional"):
            entry.optional = True
        if t.get("reshape") is not None:
            entry.reshape.shape.extend(t["reshape"])


def add_outputs(config: mc.ModelConfig, tensors: list[dict[str, Any]]) -> None:
    for t in tensors:
        config.output.add(name=t["name"], data_type=dtype(t["type"]), dims=t["dims"])


def set_parameters(config: mc.ModelConfig, params: dict[str, Any]) -> None:
    """Model `parameters { key: ... value: { string_value: ... } }`; bools as "true"/"false"."""
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        config.parameters[key].string_value = str(value)


def to_text(config: mc.ModelConfig) -> str:
    return text_format.MessageToString(config)


def write_config(model_dir: Path, config: mc.ModelConfig) -> Path:
    model_dir.mkdir(parents=True, exist_ok=True)
    path = model_dir / "config.pbtxt"
    path.write_text(to_text(config), encoding="utf-8")
    return path


def read_config(path: Path) -> mc.ModelConfig:
    """Parse a config.pbtxt with the protobuf schema; any unknown field or bad value is an error."""
    try:
        return text_format.Parse(Path(path).read_text(encoding="utf-8"), mc.ModelConfig())
    except text_format.ParseError as exc:
        raise RepositoryError(f"{path}: not a valid Triton model config: {exc}",
                              hint="re-emit the repository with `trtspec build`") from None


def to_json(config: mc.ModelConfig) -> str:
    """JSON form, as `load_model(config=...)` on a running server expects."""
    return json_format.MessageToJson(config, preserving_proto_field_name=True)
