"""The spec's problems and the rules that need nothing but the spec: schema version, lengths, devices, ports,
drafters, quantization and the K schedule. trtspec.check interleaves them with the method's and the runtime's
rules (check.meaning_problems); a spec read for its shape gets `spec_problems`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trtspec.errors import TrtspecError
from trtspec.names import RESERVED_MODEL_NAMES
from trtspec.spec.schema import SCHEMA_VERSION, Spec


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
    """model.quantization: the torch runtime's (a GPU runtime's targets are converted unquantized); w8a8 on CPU."""
    if spec.model.quantization is None:
        return []
    if not gpu_runtime:
        return _cpu_only("model.quantization", spec.model.quantization, spec.runtime.device)
    flags = " ".join(TRTLLM_QUANTIZATION[spec.model.quantization])
    return [Problem("model.quantization", spec.model.quantization, "applies to the torch runtime; trtspec "
                    "converts TensorRT-LLM targets unquantized", f"remove it and quantize with TensorRT-LLM "
                    f"({flags}, or the LLM API's "
                    f"QuantConfig(quant_algo={TRTLLM_QUANT_ALGO[spec.model.quantization]}))")]


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


# TensorRT-LLM's quantization of a checkpoint, per mode (the script, then its flags): weight-only or SmoothQuant's
# per-channel weights and per-token activations for w8a8 (examples/*/convert_checkpoint.py), AWQ's int4 weights
# with 8-bit activations for w4a8 (examples/quantization/quantize.py); and the LLM API's QuantConfig algorithm
TRTLLM_QUANTIZATION = {"int8": ["convert_checkpoint.py", "--use_weight_only", "--weight_only_precision", "int8"],
                       "int4": ["convert_checkpoint.py", "--use_weight_only", "--weight_only_precision", "int4",
                                "--group_size", "32"],
                       "w8a8": ["convert_checkpoint.py", "--smoothquant", "0.5", "--per_channel", "--per_token"],
                       "w4a8": ["quantize.py", "--qformat", "w4a8_awq"]}
TRTLLM_QUANT_ALGO = {"int8": "W8A16", "int4": "W4A16", "w8a8": "W8A8_SQ_PER_CHANNEL", "w4a8": "W4A8_AWQ"}
CPU_ONLY = ("w8a8", "w4a8")  # trtspec's integer kernels: no path on the torch runtime's GPU


def quantization_problems(spec: Spec, weights: str | None, gpu_runtime: bool) -> list[Problem]:
    """speculative.draft_quantization: a drafter with weights of its own, on the torch runtime (trtspec's
    TensorRT-LLM converter writes unquantized checkpoints: the hint gives TensorRT-LLM's own flags)."""
    s, key = spec.speculative, "speculative.draft_quantization"
    if weights is None:
        return [Problem(key, s.draft_quantization, f"method '{s.method}' has no drafter weights to quantize",
                        "remove draft_quantization")]
    if gpu_runtime:
        flags = " ".join(TRTLLM_QUANTIZATION[s.draft_quantization])
        return [Problem(key, s.draft_quantization, "applies to the torch runtime; trtspec converts TensorRT-LLM "
                        "drafters unquantized", f"remove it and convert the drafter with TensorRT-LLM's "
                        f"{flags} (then trtllm-build as usual)")]
    return _cpu_only(key, s.draft_quantization, spec.runtime.device)


def _cpu_only(key: str, mode: str, device: str) -> list[Problem]:
    """w8a8 and w4a8 are trtspec's CPU kernels (integer dot products): the torch runtime on a GPU has no such
    path."""
    if mode not in CPU_ONLY or device == "cpu":
        return []
    return [Problem(key, mode, f"{mode} runs on CPU only (trtspec's integer kernel), not on runtime.device "
                    f"'{device}'", 'use "int8" there, or runtime.device = "cpu"')]


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
