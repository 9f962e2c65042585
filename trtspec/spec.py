"""The deployment spec (`trtspec.toml`): one typed, versioned schema every command reads.

Loading is two passes:
1. structure: pydantic models with `extra="forbid"` (unknown keys, wrong types, out-of-range values);
2. meaning: cross-field rules (`draft-model` needs `draft`, tree depth vs. heads, runtime vs. method ...).
Every problem names its key (dotted path), the value seen and the fix. All problems are collected
and raised together as one SpecError whose `problems` list `trtspec check` prints.

Relative paths resolve against the folder of the spec file.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError

from trtspec.errors import SpecError
from trtspec.names import NAME_RULE, RESERVED_MODEL_NAMES, PathName

SCHEMA_VERSION = 1
DEFAULT_SPEC = "trtspec.toml"

Method = Literal["draft-model", "medusa", "eagle", "lookahead", "none"]
RuntimeKind = Literal["torch", "trtllm-engine", "trtllm-llmapi"]
DType = Literal["float32", "float16", "bfloat16"]
GpuType = Literal["cpu", "h100", "h200"]

MAX_DRAFT_TOKENS = 64


class _Strict(BaseModel):
    """Strict types: TOML already gives ints, floats, bools and strings, so a value of another type is a mistake
    (lax mode would take `true` as 1 and `"4"` as 4). Strict pydantic still takes an int for a float field."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


def _checkpoint_path(value: Any, info: ValidationInfo) -> Any:
    """A checkpoint path as written in the spec: no NUL byte, `~` / `~user` expanded and a relative path
    resolved against the spec's folder (the validation context's `base`; none: kept as written). Failures
    are problems of the key, never an exception out of the parser."""
    if not isinstance(value, (str, Path)):
        return value  # the Path validator names the wrong type
    text = str(value)
    if "\0" in text:
        raise PydanticCustomError("path_nul", "contains a NUL byte")
    base = (info.context or {}).get("base")
    if base is None:
        return value
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # '~user' of an unknown user (or no home directory at all)
        raise PydanticCustomError("path_home", "cannot expand {user}: no such user or home directory",
                                  {"user": text.split("/", 1)[0]}) from None
    try:
        return path if path.is_absolute() else (Path(base) / path).resolve()
    except (OSError, RuntimeError) as exc:  # e.g. a symlink loop
        raise PydanticCustomError("path_resolve", "cannot resolve the path: {why}", {"why": str(exc)}) from None


# A checkpoint dir given as a string (lax: TOML has no path type).
CheckpointPath = Annotated[Path, Strict(False), BeforeValidator(_checkpoint_path)]


class ModelSection(_Strict):
    name: PathName = Field("model", description="deployment name: engines/<name>/, model_repository/<name>/")
    target: CheckpointPath = Field(description="target checkpoint dir (HF format: config.json + safetensors)")
    tokenizer: CheckpointPath | None = Field(None, description="tokenizer dir (default: the target dir)")
    dtype: DType = Field("float16", description="serving dtype of the weights")


class LookaheadSection(_Strict):
    window: int = Field(4, ge=1, le=64, description="W: lookahead window size")
    ngram: int = Field(3, ge=1, le=16, description="N: n-gram size")
    verification_set: int = Field(4, ge=0, le=64, description="G: verification set size")


class AdaptiveSection(_Strict):
    enabled: bool = True
    min_draft_tokens: int = Field(1, ge=1, le=MAX_DRAFT_TOKENS)
    history: int = Field(8, ge=1, le=1024, description="steps of acceptance history per request")
    fallback_acceptance: float = Field(0.2, ge=0.0, le=1.0, description="below this, fall back to plain decoding")


class SpeculativeSection(_Strict):
    method: Method = "draft-model"
    draft: CheckpointPath | None = Field(None, description="draft checkpoint dir (method draft-model)")
    heads: CheckpointPath | None = Field(None, description="Medusa heads / EAGLE head dir (method medusa, eagle)")
    num_draft_tokens: int = Field(4, ge=1, le=MAX_DRAFT_TOKENS, description="K: max draft tokens per step")
    choices: list[list[int]] | None = Field(None, description="tree of top-i paths (medusa, eagle)")
    lookahead: LookaheadSection = LookaheadSection()
    adaptive: AdaptiveSection = AdaptiveSection()


class LimitsSection(_Strict):
    max_batch_size: int = Field(4, ge=1, le=4096)
    max_input_len: int = Field(512, ge=1, le=1 << 20)
    max_output_len: int = Field(256, ge=1, le=1 << 20)

    @property
    def max_seq_len(self) -> int:
        return self.max_input_len + self.max_output_len


class TorchRuntime(_Strict):
    threads: int = Field(0, ge=0, le=1024, description="intra-op threads (0: torch default)")


class TrtllmRuntime(_Strict):
    version: str = Field("1.2.1", description="TensorRT-LLM version of the build and serving container")
    image: str = Field("nvcr.io/nvidia/tritonserver:25.12-trtllm-python-py3", description="Triton TRT-LLM image")
    trtllm_build: str = Field("trtllm-build", description="command that runs trtllm-build")
    build_timeout_s: int = Field(7200, ge=1)
    kv_cache_free_gpu_mem_fraction: float | None = Field(None, gt=0.0, le=1.0)
    use_draft_logits: bool = False
    extra_build_args: list[str] = []


class RuntimeSection(_Strict):
    kind: RuntimeKind = "torch"
    device: Literal["cpu", "cuda"] = "cpu"
    torch: TorchRuntime = TorchRuntime()
    trtllm: TrtllmRuntime = TrtllmRuntime()


class GpuSection(_Strict):
    type: GpuType = "cpu"
    count: int = Field(1, ge=1, le=1024)
    tensor_parallel: int = Field(1, ge=1, le=1024)
    pipeline_parallel: int = Field(1, ge=1, le=1024)


class ServingSection(_Strict):
    ensemble_name: PathName = Field("ensemble", description="the ensemble model (a directory of the repository)")
    instances: int = Field(1, ge=1, le=64, description="instances of the generation model")
    http_port: int = Field(8000, ge=0, le=65535)
    grpc_port: int = Field(8001, ge=0, le=65535)
    metrics_port: int = Field(8002, ge=0, le=65535)
    streaming: bool = True


class Spec(_Strict):
    schema_: int = Field(alias="schema")
    model: ModelSection
    speculative: SpeculativeSection = SpeculativeSection()
    limits: LimitsSection = LimitsSection()
    runtime: RuntimeSection = RuntimeSection()
    gpu: GpuSection = GpuSection()
    serving: ServingSection = ServingSection()

    # Where the spec came from; relative paths were resolved against its folder.
    source: Path | None = Field(None, exclude=True, strict=False)

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def method(self) -> str:
        return self.speculative.method

    @property
    def tokenizer_dir(self) -> Path:
        return self.model.tokenizer or self.model.target

    @property
    def world_size(self) -> int:
        return self.gpu.tensor_parallel * self.gpu.pipeline_parallel

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (paths as strings), keys as written in trtspec.toml."""
        return self.model_dump(mode="json", by_alias=True, exclude={"source"})


@dataclasses.dataclass(frozen=True)
class Problem:
    key: str
    value: Any
    message: str
    hint: str = ""

    def __str__(self) -> str:
        shown = "" if self.value is _MISSING else f" = {self.value!r}"
        hint = f" (fix: {self.hint})" if self.hint else ""
        return f"{self.key}{shown}: {self.message}{hint}"


_MISSING = object()

_FIXES = {
    "extra_forbidden": "remove the key or check its spelling against `trtspec init`",
    "missing": "add the key",
    "literal_error": "use one of the allowed values",
    "less_than_equal": "use a smaller value",
    "less_than": "use a smaller value",
    "greater_than_equal": "use a larger value",
    "greater_than": "use a larger value",
    "int_parsing": "write a whole number without quotes",
    "int_type": "write a whole number: no quotes, no decimal point, not true/false",
    "float_parsing": "write a number without quotes",
    "float_type": "write a number without quotes",
    "bool_parsing": "write true or false",
    "bool_type": "write true or false",
    "string_type": "write a quoted string",
    "list_type": "write a list, e.g. [[0], [0, 0]]",
    "string_pattern_mismatch": "use letters, digits, '_', '-' and '.' only",
    "path_name": f"use {NAME_RULE}",
    "path_type": "write the path as a quoted string",
    "path_nul": "remove the NUL byte (\\u0000) from the path",
    "path_home": "write the path in full, or with ~/ for your own home directory",
    "path_resolve": "point it at a directory that exists",
}


def _structure_problems(exc: ValidationError) -> list[Problem]:
    problems = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        value = err.get("input", _MISSING) if err["type"] != "missing" else _MISSING
        if isinstance(value, dict):
            value = _MISSING
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown key"
        problems.append(Problem(key, value, message, _FIXES.get(err["type"], "")))
    return problems


def _meaning_problems(spec: Spec) -> list[Problem]:
    p: list[Problem] = []
    s = spec.speculative
    if spec.schema_ != SCHEMA_VERSION:
        p.append(Problem("schema", spec.schema_, f"unsupported schema version", f"set schema = {SCHEMA_VERSION}"))
    if s.method == "draft-model" and s.draft is None:
        p.append(Problem("speculative.draft", _MISSING, "method 'draft-model' needs a draft checkpoint",
                         "set speculative.draft = \"path/to/draft\" or choose another method"))
    if s.method in ("medusa", "eagle") and s.heads is None:
        p.append(Problem("speculative.heads", _MISSING, f"method '{s.method}' needs its heads dir",
                         f"set speculative.heads = \"path/to/{s.method}\""))
    if s.method not in ("draft-model",) and s.draft is not None:
        p.append(Problem("speculative.draft", str(s.draft), f"only used by method 'draft-model' (method is '{s.method}')",
                         "remove speculative.draft or set method = \"draft-model\""))
    if s.choices is not None:
        if s.method not in ("medusa", "eagle"):
            p.append(Problem("speculative.choices", s.choices, "a tree only applies to medusa and eagle",
                             "remove speculative.choices"))
        else:
            p.extend(_choice_problems(s.choices))
            if len(s.choices) > s.num_draft_tokens:
                p.append(Problem("speculative.num_draft_tokens", s.num_draft_tokens,
                                 f"the tree in speculative.choices has {len(s.choices)} nodes; every node is a draft "
                                 "token (TensorRT-LLM's max_draft_len)",
                                 f"set num_draft_tokens >= {len(s.choices)} or prune the tree"))
    lim = spec.limits
    if spec.runtime.kind == "trtllm-engine" and s.method == "lookahead":
        need = lookahead_max_draft_len(s.lookahead.window, s.lookahead.ngram, s.lookahead.verification_set)
        if need > 256:
            p.append(Problem("speculative.lookahead", s.lookahead.model_dump(), f"needs max_draft_len {need} > 256",
                             "use a smaller window, ngram or verification_set"))
    if s.method == "lookahead" and s.lookahead.ngram < 2:
        p.append(Problem("speculative.lookahead.ngram", s.lookahead.ngram, "lookahead needs n-grams of length >= 2",
                         "set ngram >= 2"))
    if s.adaptive.min_draft_tokens > s.num_draft_tokens:
        p.append(Problem("speculative.adaptive.min_draft_tokens", s.adaptive.min_draft_tokens,
                         f"exceeds speculative.num_draft_tokens ({s.num_draft_tokens})",
                         "lower min_draft_tokens or raise num_draft_tokens"))
    if lim.max_seq_len + s.num_draft_tokens > 1 << 20:
        p.append(Problem("limits.max_input_len", lim.max_input_len, "input + output length is too large",
                         "keep max_input_len + max_output_len under 1M tokens"))
    rt, gpu = spec.runtime, spec.gpu
    if rt.kind != "torch" and gpu.type == "cpu":
        p.append(Problem("gpu.type", gpu.type, f"runtime '{rt.kind}' needs a GPU",
                         "set gpu.type = \"h100\" or \"h200\", or runtime.kind = \"torch\""))
    if rt.kind != "torch" and rt.device != "cuda":
        p.append(Problem("runtime.device", rt.device, f"runtime '{rt.kind}' runs on CUDA only",
                         "set runtime.device = \"cuda\""))
    if rt.kind == "torch" and spec.world_size > 1:
        p.append(Problem("gpu.tensor_parallel", gpu.tensor_parallel, "the torch runtime runs on one device",
                         "set tensor_parallel = pipeline_parallel = 1, or use a trtllm runtime"))
    if spec.world_size > gpu.count:
        p.append(Problem("gpu.count", gpu.count,
                         f"tensor_parallel x pipeline_parallel = {spec.world_size} GPUs are needed",
                         f"set gpu.count >= {spec.world_size}"))
    if rt.kind == "trtllm-llmapi" and s.method == "medusa":
        p.append(Problem("speculative.method", s.method, "the TensorRT-LLM LLM API (PyTorch backend) does not support it",
                         "use runtime.kind = \"trtllm-engine\", or method draft-model, eagle or lookahead "
                         "(served as the LLM API's NGram drafter)"))
    if s.method == "eagle" and gpu.pipeline_parallel > 1 and rt.kind == "trtllm-engine":
        p.append(Problem("gpu.pipeline_parallel", gpu.pipeline_parallel, "EAGLE does not support pipeline parallelism",
                         "set pipeline_parallel = 1"))
    if spec.runtime.device == "cuda" and gpu.type == "cpu":
        p.append(Problem("gpu.type", gpu.type, "runtime.device is 'cuda' but gpu.type is 'cpu'",
                         "set gpu.type = \"h100\" or \"h200\""))
    if spec.serving.ensemble_name in RESERVED_MODEL_NAMES:
        p.append(Problem("serving.ensemble_name", spec.serving.ensemble_name,
                         "is the name of another model in the deployment's repository",
                         "choose another name, e.g. \"ensemble\""))
    ports = {k: getattr(spec.serving, k) for k in ("http_port", "grpc_port", "metrics_port")}
    used = [v for v in ports.values() if v]
    if len(set(used)) != len(used):
        p.append(Problem("serving.grpc_port", ports, "http, grpc and metrics ports must differ",
                         "give each a different port (0 picks a free one)"))
    return p


def lookahead_max_draft_len(window: int, ngram: int, verification_set: int) -> int:
    """TensorRT-LLM's engine `max_draft_len` for lookahead (W, N, G) (examples/lookahead/README.md)."""
    return (0 if ngram == 1 else ngram - 2) + (window - 1 + verification_set) * (ngram - 1)


def _choice_problems(choices: list[list[int]]) -> list[Problem]:
    p = []
    seen = set()
    for i, path in enumerate(choices):
        key = f"speculative.choices[{i}]"
        if not path:
            p.append(Problem(key, path, "empty path", "remove it: the root is implicit"))
            continue
        if any(c < 0 for c in path):
            p.append(Problem(key, path, "top-i indices must be >= 0", "use non-negative indices"))
        if tuple(path[:-1]) not in seen and len(path) > 1:
            p.append(Problem(key, path, f"parent path {path[:-1]} is not listed before it",
                             "list every prefix of a path before the path"))
        if tuple(path) in seen:
            p.append(Problem(key, path, "duplicate path", "remove the duplicate"))
        seen.add(tuple(path))
    if len(choices) > MAX_DRAFT_TOKENS * 4:
        p.append(Problem("speculative.choices", f"{len(choices)} paths", "tree too large", "use at most 256 paths"))
    return p


def check_heads_depth(spec: Spec, num_heads: int) -> list[Problem]:
    """Problems with a medusa tree that is deeper than the number of heads (needs the heads' config)."""
    choices = spec.speculative.choices or []
    deepest = max((len(c) for c in choices), default=0)
    if spec.method == "medusa" and deepest > num_heads:
        return [Problem("speculative.choices", f"depth {deepest}",
                        f"deeper than the number of Medusa heads ({num_heads})",
                        f"keep every path at most {num_heads} long")]
    if spec.method == "medusa" and spec.speculative.num_draft_tokens > num_heads and not choices:
        return [Problem("speculative.num_draft_tokens", spec.speculative.num_draft_tokens,
                        f"a Medusa chain cannot be longer than the number of heads ({num_heads})",
                        f"set num_draft_tokens <= {num_heads} or give a tree in speculative.choices")]
    return []


def spec_from_dict(data: dict[str, Any], base: Path | None = None, source: Path | None = None) -> Spec:
    """Validate a spec given as a dict (already parsed TOML); relative checkpoint paths resolve against `base`
    (none: kept as written). Raises SpecError listing every problem."""
    where = f" in {source}" if source else ""
    try:
        spec = Spec.model_validate({**data, "source": source}, context={"base": base})
    except ValidationError as exc:
        problems = _structure_problems(exc)
        raise _spec_error(problems, where) from None
    problems = _meaning_problems(spec)
    if problems:
        raise _spec_error(problems, where)
    return spec


def _spec_error(problems: list[Problem], where: str) -> SpecError:
    first = problems[0]
    more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" if len(problems) > 1 else ""
    message = f"{first}{where}{more}"
    return SpecError(message, hint="`trtspec check` lists every problem; `trtspec init` writes a valid example",
                     problems=[str(p) for p in problems])


def load_spec(path: str | Path = DEFAULT_SPEC) -> Spec:
    """Read and validate `trtspec.toml`. Raises SpecError naming the key and the fix."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"spec file not found: {path}",
                        hint="pass -c/--config PATH, or run `trtspec init` to write one")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML: {exc}", hint="fix the TOML syntax at the line shown") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not UTF-8 text", hint="save the spec as UTF-8") from None
    return spec_from_dict(data, base=path.resolve().parent, source=path)


def check_paths(spec: Spec) -> list[Problem]:
    """Problems with checkpoint paths that do not exist (done by `check`, not by loading)."""
    p = []
    items = [("model.target", spec.model.target), ("model.tokenizer", spec.model.tokenizer),
             ("speculative.draft", spec.speculative.draft), ("speculative.heads", spec.speculative.heads)]
    for key, path in items:
        if path is None:
            continue
        if not Path(path).is_dir():
            p.append(Problem(key, str(path), "directory not found", "point it at a checkpoint directory"))
        elif key != "model.tokenizer" and not (Path(path) / "config.json").is_file():
            p.append(Problem(key, str(path), "no config.json in the directory", "point it at an HF-format checkpoint"))
    return p
