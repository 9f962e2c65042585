"""The spec's schema: pydantic models of every section of `trtspec.toml`, strict types, checkpoint paths resolved
against the spec's folder, and `speculative.method` as one of the names the validation context passes in
(trtspec.check passes the registered methods')."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationInfo
from pydantic_core import PydanticCustomError

from trtspec.names import PathName

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
    quantization: Literal["int8", "w8a8", "w4a8"] | None = Field(
        None, description="quantized target (torch runtime): int8 = weight-only per-channel int8 linears, float32 "
        "activations (bf16 where trtspec's CPU kernel is not built); w8a8 = the same weights times activations "
        "rounded to int8 per token, integer sums (faster verify passes); w4a8 = 4-bit weights in groups of 32 "
        "times int8 activations, integer sums (CPU; half w8a8's bytes); each another model than the float "
        "one, speculative and plain decoding of it stay token-identical")


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
    min_matching: int = Field(1, ge=1, le=16, description="shortest n-gram a match may have (vLLM's "
                              "prompt_lookup_min; torch): 2 leaves out one-token matches, which mostly propose noise")
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
    fallback_acceptance: float = Field(0.0, ge=0.0, le=1.0, description="an optional floor: below this acceptance, "
                                       "fall back to plain decoding (0: off; the measured costs decide)")


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
    draft_quantization: Literal["int8", "int4", "w8a8", "w4a8"] | None = Field(
        None, description="quantization of the drafter's linears (torch runtime): int8 per channel, int4 per "
                          "group of 32 (weight-only), w8a8 = int8 weights and activations, w4a8 = 4-bit "
                          "weights in groups of 32 and int8 activations (CPU)")
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
