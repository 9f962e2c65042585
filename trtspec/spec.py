"""The deployment spec (`trtspec.toml`): one typed, versioned schema every command reads.

This module validates the spec's SHAPE: pydantic models with `extra="forbid"` (unknown keys, wrong types,
out-of-range values), then the cross-field rules that need nothing but the spec (schema version, lengths,
devices, ports). The rules that need a method or a runtime (each method's own, what a runtime takes of it)
are not here: the composition point above them, trtspec/check.py, passes them in (`rules`, and the registered
method names `speculative.method` takes) and the CLI loads specs through it. Every problem names its key
(dotted path), the value seen and the fix. All problems are collected and raised together as one SpecError
whose `problems` list `trtspec check` prints.

Relative paths resolve against the folder of the spec file.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError

from trtspec.errors import SpecError, TrtspecError
from trtspec.names import NAME_RULE, RESERVED_MODEL_NAMES, PathName

SCHEMA_VERSION = 1
DEFAULT_SPEC = "trtspec.toml"

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


def _method_name(value: Any, info: ValidationInfo) -> Any:
    """A registered method's name, when the validation context names them (`methods`: the built-in ones, then
    plug-ins, as trtspec.check passes them); anything else is refused as a Literal field refuses it, listing
    the names. Without them any string passes here (a spec read for its shape only)."""
    known = (info.context or {}).get("methods")
    if known is None or (isinstance(value, str) and value in known):
        return value
    shown = [repr(n) for n in known]
    raise PydanticCustomError("literal_error", "Input should be {expected}",
                              {"expected": f"{', '.join(shown[:-1])} or {shown[-1]}" if len(shown) > 1 else shown[0]})


# speculative.method: one of the registered methods' names (trtspec.methods.names(), passed in by trtspec.check)
Method = Annotated[str, BeforeValidator(_method_name)]


class ModelSection(_Strict):
    name: PathName = Field("model", description="deployment name: engines/<name>/, model_repository/<name>/")
    target: CheckpointPath = Field(description="target checkpoint dir (HF format: config.json + safetensors)")
    tokenizer: CheckpointPath | None = Field(None, description="tokenizer dir (default: the target dir)")
    dtype: DType = Field("float16", description="serving dtype of the weights")
    quantization: Literal["int8"] | None = Field(
        None, description="weight-only int8 target (torch runtime): per-channel int8 linears, bf16 activations; "
        "another model than the float one, speculative and plain decoding of it stay token-identical")


class LookaheadSection(_Strict):
    """Lookahead decoding (Fu et al., ICML 2024): TensorRT-LLM's lookahead_window_size / _ngram_size /
    _verification_set_size, 1:1."""

    window: int = Field(4, ge=1, le=64, description="W: Jacobi window size (n-grams the lookahead branch grows)")
    ngram: int = Field(3, ge=1, le=16, description="N: n-gram size (at most N - 1 tokens accepted per step)")
    verification_set: int = Field(4, ge=0, le=64, description="G: n-grams verified per step")


class NgramSection(_Strict):
    """Prompt lookup (method ngram): the LLM API's NGram drafter."""

    max_matching: int = Field(3, ge=1, le=16, description="longest n-gram matched at the end of the sequence "
                              "(the LLM API's max_matching_ngram_size)")
    candidates: int = Field(4, ge=1, le=64, description="continuations verified together as a trie (torch)")


class SuffixSection(_Strict):
    """SuffixDecoding (arXiv 2411.04975; vLLM's suffix_decoding_* keys). The cross-request cache is off by
    default: it speculates one request's text from another's outputs, so it can carry one user's text into
    another user's speculation (never into the output: verification keeps that exact)."""

    max_depth: int = Field(24, ge=2, le=256, description="suffix tree depth: match + speculation length")
    max_spec_factor: float = Field(1.0, ge=0.0, le=64.0, description="alpha: speculate up to alpha * match + offset")
    max_spec_offset: float = Field(0.0, ge=-64.0, le=64.0, description="offset of the speculation length")
    min_token_prob: float = Field(0.1, ge=0.0, le=1.0, description="stop where the path's frequency falls below")
    cache_requests: int = Field(0, ge=0, le=1 << 20, description="earlier requests' outputs kept for all "
                                "requests (FIFO); 0: off (the default: see the docstring)")
    cache_tokens: int = Field(1 << 20, ge=1, le=1 << 28, description="bound on the cached requests' tokens")


class AdaptiveSection(_Strict):
    enabled: bool = True
    min_draft_tokens: int = Field(1, ge=1, le=MAX_DRAFT_TOKENS)
    history: int = Field(8, ge=1, le=1024, description="steps of acceptance history per request")
    fallback_acceptance: float = Field(0.2, ge=0.0, le=1.0, description="below this, fall back to plain decoding")


def _schedule_keys(value: Any) -> Any:
    """TOML table keys are strings (`schedule = {1 = 4, 4 = 2}` reads as {"1": 4, "4": 2}): whole-number keys
    become ints; anything else is left for the int validator to name."""
    if isinstance(value, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in value.items()}
    return value


# speculative.schedule: {smallest batch size of a band = K}
Schedule = Annotated[dict[int, int], BeforeValidator(_schedule_keys)]


class DrafterSection(_Strict):
    """One drafter of a routed spec (`[[speculative.drafters]]`, method "routed"): the keys of a single-drafter
    [speculative] section (its method, weights, K, tree and the method's own table) under a name the router and
    the per-drafter metrics use. Each is checked against the target exactly as a single drafter would be."""

    name: PathName = Field(description="the drafter's name: a router target, the metrics' drafter label")
    method: Method = "draft-model"
    draft: CheckpointPath | None = Field(None, description="draft checkpoint dir (method draft-model)")
    heads: CheckpointPath | None = Field(None, description="Medusa heads / EAGLE head dir (method medusa, eagle)")
    num_draft_tokens: int = Field(4, ge=1, le=MAX_DRAFT_TOKENS, description="K: this drafter's max draft tokens")
    choices: list[list[int]] | None = Field(None, description="tree of top-i paths (medusa, eagle)")
    lookahead: LookaheadSection = LookaheadSection()
    ngram: NgramSection = NgramSection()
    suffix: SuffixSection = SuffixSection()


class RouterSection(_Strict):
    """How a routed spec picks each request's drafter, once, when the request is admitted: the request's `task`
    when it sends one (a drafter's name or a key of `routes`; anything else is refused), else by `kind`:
    "task" sends it to `default`, "classify" classifies its prompt as "code" or "prose"
    (trtspec/runtime/router.py: the share of code-like characters and keywords) and looks that up in `routes`."""

    kind: Literal["task", "classify"] = "classify"
    default: PathName = Field(description="the drafter of a request with no task and no matching route")
    routes: dict[PathName, PathName] = Field(default_factory=dict, description="task or class -> drafter name, "
                                             "e.g. {code = \"ngram\", prose = \"draft\"}")


class SpeculativeSection(_Strict):
    method: Method = "draft-model"
    draft: CheckpointPath | None = Field(None, description="draft checkpoint dir (method draft-model)")
    heads: CheckpointPath | None = Field(None, description="Medusa heads / EAGLE head dir (method medusa, eagle)")
    num_draft_tokens: int = Field(4, ge=1, le=MAX_DRAFT_TOKENS, description="K: max draft tokens per step")
    choices: list[list[int]] | None = Field(None, description="tree of top-i paths (medusa, eagle)")
    draft_quantization: Literal["int8", "int4"] | None = Field(
        None, description="weight-only quantization of the drafter's linears (torch runtime): int8 per channel, "
                          "int4 per group of 32")
    schedule: Schedule | None = Field(None, description="K by load: {smallest batch size of a band = K}, e.g. "
                                      "{1 = 4, 4 = 2} (trtspec tune writes it; TensorRT-LLM's draft_len_schedule)")
    lookahead: LookaheadSection = LookaheadSection()
    ngram: NgramSection = NgramSection()
    suffix: SuffixSection = SuffixSection()
    adaptive: AdaptiveSection = AdaptiveSection()
    drafters: list[DrafterSection] | None = Field(None, description="method routed: the drafters one deployment "
                                                  "serves (each request uses one, chosen by the router)")
    router: RouterSection | None = Field(None, description="method routed: how a request's drafter is chosen")


def drafter_spec(spec: Spec, d: DrafterSection) -> Spec:
    """The single-drafter spec a routed spec's drafter `d` is: [speculative] = its keys (adaptive K shared), the
    rest as the spec says. What the drafter's method checks, pairs and builds its proposer from."""
    keys = {k: getattr(d, k) for k in DrafterSection.model_fields if k != "name"}
    section = SpeculativeSection.model_construct(**keys, adaptive=spec.speculative.adaptive)
    return spec.model_copy(update={"speculative": section})


def drafter_role(name: str, weights: str) -> str:
    """The engine-dir role (a directory) of a routed spec's drafter's weights: e.g. "draft-prose"."""
    return f"{weights}-{name}"


class LimitsSection(_Strict):
    max_batch_size: int = Field(4, ge=1, le=4096)
    max_input_len: int = Field(512, ge=1, le=1 << 20)
    max_output_len: int = Field(256, ge=1, le=1 << 20)

    @property
    def max_seq_len(self) -> int:
        return self.max_input_len + self.max_output_len


class TorchRuntime(_Strict):
    threads: int = Field(0, ge=0, le=1024, description="intra-op threads (0: torch default)")
    row_exact: bool | None = Field(None, description="row-exact target passes: each verified row computes as a "
                                   "one-row decode step would (same bits; ~5-8 % slower speculation); default: on "
                                   "for a quantized target, off for float ones (their rows differ by ~1e-5 in "
                                   "the logits: only near-ties could flip); the fused CPU kernel's passes are "
                                   "row-exact either way")


class TrtllmRuntime(_Strict):
    # The defaults agree with trtspec/backends/trtllm_versions.py (26.07 is the newest container with 1.2.1).
    version: str = Field("1.2.1", description="TensorRT-LLM version of the build and serving container")
    image: str = Field("nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3", description="Triton TRT-LLM image")
    dtype: DType | None = Field(None, description="dtype the TensorRT-LLM runtimes build and serve (default: "
                                "model.dtype); FP16/BF16 only")
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
    def trtllm_dtype(self) -> str:
        """The dtype the TensorRT-LLM runtimes convert, build and serve: runtime.trtllm.dtype, else model.dtype
        (a spec can keep float32 for the torch runtime and say float16 for TensorRT-LLM)."""
        return self.runtime.trtllm.dtype or self.model.dtype

    @property
    def world_size(self) -> int:
        return self.gpu.tensor_parallel * self.gpu.pipeline_parallel

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (paths as strings), keys as written in trtspec.toml."""
        data = self.model_dump(mode="json", by_alias=True, exclude={"source"})
        if self.speculative.drafters is None and self.speculative.router is None:  # a single-drafter spec reads
            data["speculative"].pop("drafters")                                    # as it did before routing
            data["speculative"].pop("router")
        elif "num_draft_tokens" not in self.speculative.model_fields_set:  # a routed spec's K is per drafter
            data["speculative"].pop("num_draft_tokens")
        return data


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


def raise_first(problems: list[Problem], error: type[TrtspecError]) -> None:
    """Raise the first problem as `error` (a converter or builder asking a rule again)."""
    if problems:
        p = problems[0]
        shown = "" if p.value is _MISSING else f" = {p.value!r}"
        raise error(f"{p.key}{shown}: {p.message}", hint=p.hint)

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


# --------------------------------------------------------------------------- rules that need the spec only
# trtspec.check.meaning_problems interleaves them with the method's and the runtime's rules, in this order.

def schema_problems(spec: Spec) -> list[Problem]:
    if spec.schema_ != SCHEMA_VERSION:
        return [Problem("schema", spec.schema_, "unsupported schema version", f"set schema = {SCHEMA_VERSION}")]
    return []


def drafters_problems(spec: Spec, routed: bool, routed_methods: Sequence[str]) -> list[Problem]:
    """speculative.drafters / speculative.router, which only a method that routes (`routed`) takes; the hint
    names `routed_methods`, the ones that do."""
    s, p = spec.speculative, []
    if routed:
        return p
    fixes = [f"set method = \"{m}\"" for m in routed_methods]
    for key in ("drafters", "router"):
        if getattr(s, key) is not None:
            p.append(Problem(f"speculative.{key}", _MISSING, f"only a routed spec has several drafters "
                             f"(method is '{s.method}')", " or ".join([*fixes, f"remove speculative.{key}"])))
    return p


def model_quantization_problems(spec: Spec, gpu_runtime: bool) -> list[Problem]:
    """model.quantization: the torch runtime's (a GPU runtime's targets are converted unquantized)."""
    if spec.model.quantization is None or not gpu_runtime:
        return []
    flags = " ".join(TRTLLM_WEIGHT_ONLY[spec.model.quantization])
    return [Problem("model.quantization", spec.model.quantization, "applies to the torch runtime; trtspec "
                    "converts TensorRT-LLM targets unquantized", f"remove it and quantize with TensorRT-LLM "
                    f"(convert_checkpoint.py {flags}, or the LLM API's QuantConfig(quant_algo=W8A16))")]


def length_problems(spec: Spec) -> list[Problem]:
    s, lim, p = spec.speculative, spec.limits, []
    if s.adaptive.min_draft_tokens > s.num_draft_tokens:
        p.append(Problem("speculative.adaptive.min_draft_tokens", s.adaptive.min_draft_tokens,
                         f"exceeds speculative.num_draft_tokens ({s.num_draft_tokens})",
                         "lower min_draft_tokens or raise num_draft_tokens"))
    if lim.max_seq_len + s.num_draft_tokens > 1 << 20:
        p.append(Problem("limits.max_input_len", lim.max_input_len, "input + output length is too large",
                         "keep max_input_len + max_output_len under 1M tokens"))
    return p


def gpu_count_problems(spec: Spec) -> list[Problem]:
    if spec.world_size > spec.gpu.count:
        return [Problem("gpu.count", spec.gpu.count,
                        f"tensor_parallel x pipeline_parallel = {spec.world_size} GPUs are needed",
                        f"set gpu.count >= {spec.world_size}")]
    return []


def device_problems(spec: Spec) -> list[Problem]:
    if spec.runtime.device == "cuda" and spec.gpu.type == "cpu":
        return [Problem("gpu.type", spec.gpu.type, "runtime.device is 'cuda' but gpu.type is 'cpu'",
                        "set gpu.type = \"h100\" or \"h200\"")]
    return []


def serving_problems(spec: Spec) -> list[Problem]:
    p = []
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


def spec_problems(spec: Spec) -> list[Problem]:
    """The rules of this module alone, in trtspec.check's order (what a spec read for its shape gets)."""
    return [*schema_problems(spec), *length_problems(spec), *gpu_count_problems(spec), *device_problems(spec),
            *serving_problems(spec)]


# TensorRT-LLM's weight-only quantization of a checkpoint (examples/*/convert_checkpoint.py), per mode
TRTLLM_WEIGHT_ONLY = {"int8": ["--use_weight_only", "--weight_only_precision", "int8"],
                      "int4": ["--use_weight_only", "--weight_only_precision", "int4", "--group_size", "32"]}


def quantization_problems(spec: Spec, weights: str | None, gpu_runtime: bool) -> list[Problem]:
    """speculative.draft_quantization: a drafter with weights of its own, on the torch runtime (trtspec's
    TensorRT-LLM converter writes unquantized checkpoints: the hint gives TensorRT-LLM's own flags)."""
    s, key = spec.speculative, "speculative.draft_quantization"
    if weights is None:
        return [Problem(key, s.draft_quantization, f"method '{s.method}' has no drafter weights to quantize",
                        "remove draft_quantization")]
    if gpu_runtime:
        flags = " ".join(TRTLLM_WEIGHT_ONLY[s.draft_quantization])
        return [Problem(key, s.draft_quantization, "applies to the torch runtime; trtspec converts TensorRT-LLM "
                        "drafters unquantized", f"remove it and convert the drafter with TensorRT-LLM's "
                        f"convert_checkpoint.py {flags} (then trtllm-build as usual)")]
    return []


SCHEDULE_FLOOR = 1  # the smallest K draft_len_schedule gets (TensorRT-LLM's min_runtime_draft_len, PR #16888)


def schedule_problems(spec: Spec, drafts: bool = True) -> list[Problem]:
    """speculative.schedule: band keys are the smallest batch size of each band (TensorRT-LLM's draft_len_schedule
    doc: "batch_size >= 4 uses draft_len=2"), each in 1..limits.max_batch_size; K at batch 1 is
    num_draft_tokens (TensorRT-LLM requires schedule[1] == max_draft_len); every K in 0..num_draft_tokens
    (0: no drafting in that band; the torch runtime's drafters catch up on what they missed when a band with
    K > 0 resumes, and `draft_len_schedule` floors it at SCHEDULE_FLOOR for TensorRT-LLM)."""
    s, lim, p = spec.speculative, spec.limits, []
    key = "speculative.schedule"
    if not drafts:
        return [Problem(key, s.schedule, f"method '{s.method}' drafts nothing to schedule", "remove the schedule")]
    if not s.schedule:
        return [Problem(key, s.schedule, "empty schedule", "remove it, or give bands, e.g. {1 = 4, 4 = 2}")]
    for batch, k in sorted(s.schedule.items()):
        if not 1 <= batch <= lim.max_batch_size:
            p.append(Problem(f"{key}.{batch}", k, f"batch size {batch} is outside 1..limits.max_batch_size "
                             f"({lim.max_batch_size})", "use band keys a batch can reach"))
        if not 0 <= k <= s.num_draft_tokens:
            p.append(Problem(f"{key}.{batch}", k, f"K must be in 0..speculative.num_draft_tokens "
                             f"({s.num_draft_tokens})", "lower it, or raise num_draft_tokens"))
    if 1 in s.schedule and s.schedule[1] != s.num_draft_tokens:
        p.append(Problem(f"{key}.1", s.schedule[1], f"batch 1's K is speculative.num_draft_tokens "
                         f"({s.num_draft_tokens}; TensorRT-LLM's max_draft_len)",
                         f"set it to {s.num_draft_tokens} or leave key 1 out"))
    return p


def schedule_k(schedule: dict[int, int] | None, k_max: int, batch: int) -> int:
    """K for a batch of `batch` requests: the band with the largest key <= batch (below every key: k_max)."""
    k = k_max
    for key, value in sorted((schedule or {}).items()):
        if key <= batch:
            k = value
    return min(k, k_max)


def draft_len_schedule(spec: Spec) -> dict[int, int] | None:
    """speculative.schedule as the LLM API's `draft_len_schedule` (None: no schedule).

    Key 1 = max_draft_len (its validator requires it); every K floored at SCHEDULE_FLOOR: a one-model drafter
    (EAGLE-3, MTP) carries state across iterations that a zero-length band leaves unwritten, and acceptance
    silently collapses once drafting resumes (TensorRT-LLM PR #16888; vLLM saw schedules collapse throughput).
    The field's doc reads keys as lower bounds of bands, PR #10860 as upper bounds (and above the largest key
    as 0), so the last band is repeated at limits.max_batch_size: both readings then give every reachable
    batch size a K >= 1 (the bands shift by one key under the upper-bound reading)."""
    s = spec.speculative
    if not s.schedule:
        return None
    out = {1: s.num_draft_tokens}
    for batch, k in sorted(s.schedule.items()):
        out[batch] = max(SCHEDULE_FLOOR, min(k, s.num_draft_tokens))
    last = max(out)
    if last < spec.limits.max_batch_size:
        out[spec.limits.max_batch_size] = out[last]
    out[1] = s.num_draft_tokens
    return dict(sorted(out.items()))


Rules = Callable[[Spec], list[Problem]]


def spec_from_dict(data: dict[str, Any], base: Path | None = None, source: Path | None = None, *,
                   methods: Sequence[str] | None = None, rules: Rules = spec_problems) -> Spec:
    """Validate a spec given as a dict (already parsed TOML); relative checkpoint paths resolve against `base`
    (none: kept as written). `methods`: the names speculative.method takes (None: any); `rules`: the
    cross-field rules (default: this module's, which need no method or runtime; trtspec.check passes all of
    them). Raises SpecError listing every problem."""
    where = f" in {source}" if source else ""
    try:
        spec = Spec.model_validate({**data, "source": source}, context={"base": base, "methods": methods})
    except ValidationError as exc:
        problems = _structure_problems(exc)
        raise _spec_error(problems, where) from None
    problems = rules(spec)
    if problems:
        raise _spec_error(problems, where)
    return spec


def _spec_error(problems: list[Problem], where: str) -> SpecError:
    first = problems[0]
    more = f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})" if len(problems) > 1 else ""
    message = f"{first}{where}{more}"
    return SpecError(message, hint="`trtspec check` lists every problem; `trtspec init` writes a valid example",
                     problems=[str(p) for p in problems])


def load_spec(path: str | Path = DEFAULT_SPEC, *, methods: Sequence[str] | None = None,
              rules: Rules = spec_problems) -> Spec:
    """Read and validate `trtspec.toml` (`methods`, `rules`: as spec_from_dict's; trtspec.check.load_spec passes
    them). Raises SpecError naming the key and the fix."""
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
    return spec_from_dict(data, base=path.resolve().parent, source=path, methods=methods, rules=rules)


def check_paths(spec: Spec) -> list[Problem]:
    """Problems with checkpoint paths that do not exist (done by `check`, not by loading)."""
    p = []
    items = [("model.target", spec.model.target), ("model.tokenizer", spec.model.tokenizer),
             ("speculative.draft", spec.speculative.draft), ("speculative.heads", spec.speculative.heads)]
    for i, d in enumerate(spec.speculative.drafters or ()):
        items += [(f"speculative.drafters[{i}].draft", d.draft), (f"speculative.drafters[{i}].heads", d.heads)]
    for key, path in items:
        if path is None:
            continue
        if not Path(path).is_dir():
            p.append(Problem(key, str(path), "directory not found", "point it at a checkpoint directory"))
        elif key != "model.tokenizer" and not (Path(path) / "config.json").is_file():
            p.append(Problem(key, str(path), "no config.json in the directory", "point it at an HF-format checkpoint"))
    return p
