"""`trtspec export vllm`: the `vllm serve` command equivalent to a spec, in today's syntax.

vLLM's speculative decoding takes one JSON argument, `--speculative-config` (vllm/config/speculative.py:
`method`, `model`, `num_speculative_tokens`, `prompt_lookup_max/min`, `num_speculative_tokens_per_batch_size`
...; every export is checked against SpeculativeConfig's fields at vLLM commit 002e77c, docs/validators.md).
A method is mapped by what the TensorRT-LLM runtimes' method tables make of it (trtspec/backends/
trtllm_engine_methods.py, trtllm_llmapi_methods.py), never by its trtspec name: its TensorRT-LLM decoding mode
(`speculative_decoding_mode`: the same algorithm under TensorRT-LLM's name), else the LLM API drafter it maps to
(`options`: speculative_config.decoding_type):

    draft_tokens_external / Draft_Target -> draft_model   (the draft checkpoint)
    medusa                               -> medusa        (chain only: vLLM drafts one token per head)
    eagle (EAGLE-1/2 head) / Eagle       -> eagle;  an EAGLE-3 head / Eagle3 -> eagle3
    NGram (prompt lookup, method ngram)  -> ngram         (prompt_lookup_max = max_matching_ngram_size)
    SA (SuffixDecoding, method suffix)   -> suffix        (suffix_decoding_* keys from [speculative.suffix])

The LLM-API mapping is asked for a vLLM export, not a TensorRT-LLM deployment: a drafter the spec's TensorRT-LLM
version lacks (SA before 1.3.0rc27) is still the algorithm it names. Anything else is a RepositoryError saying
why: lookahead decoding (vLLM has no Jacobi window; method ngram is vLLM's ngram), a suffix spec with a key vLLM
has no equivalent of, several drafters (a routed spec). The server binds 127.0.0.1 unless told otherwise and its
API takes the key from $VLLM_API_KEY (never a literal key in the command).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from trtspec import methods
from trtspec.artifacts.heads import eagle_version
from trtspec.backends.trtllm_engine_methods import engine_method
from trtspec.backends.trtllm_llmapi_methods import llmapi_method
from trtspec.errors import RepositoryError
from trtspec.spec import SCHEDULE_FLOOR, Spec

# TensorRT-LLM's decoding mode (trtllm-build --speculative_decoding_mode) -> vLLM's method
BY_DECODING_MODE = {"draft_tokens_external": "draft_model", "medusa": "medusa", "eagle": "eagle"}
# the LLM API's speculative_config.decoding_type -> vLLM's method
BY_LLMAPI_TYPE = {"Draft_Target": "draft_model", "DraftTarget": "draft_model", "Eagle": "eagle3",
                  "Eagle3": "eagle3", "NGram": "ngram", "SA": "suffix"}
LLMAPI_PROBE_VERSION = "1.3.0"  # the TensorRT-LLM version the mapping asks the LLM API's drafter of (SA: >= 1.3.0rc27)
HEAD_METHODS = frozenset({"medusa", "eagle", "eagle3"})  # vLLM methods whose `model` is a heads checkpoint
EAGLE3_OF = {"eagle": "eagle3"}  # an EAGLE-3 head under an EAGLE mode
NOTES = {"ngram": "vLLM's ngram drafts by prompt lookup (the prompt and output so far), as trtspec's ngram",
         "suffix": "vLLM's suffix needs Arctic Inference installed (pip install arctic-inference); "
                   "suffix_decoding_max_cached_requests = 0 keeps its global cache of other requests' outputs off, "
                   "as trtspec's default"}


def vllm_method(spec: Spec) -> tuple[str | None, dict[str, Any]]:
    """(vLLM's method for the spec or None for plain decoding, the LLM API's speculative_config when that
    decided it); RepositoryError when vLLM has none."""
    if not methods.get(spec.method).drafts:
        return None, {}
    name, config = BY_DECODING_MODE.get(engine_method(spec).speculative_decoding_mode or ""), {}
    if name is None:
        probe = _llmapi_probe(spec)
        try:
            config = llmapi_method(probe).options(probe).get("speculative_config") or {}
        except Exception:  # noqa: BLE001 - the LLM API refuses it: so does this mapping
            config = {}
        name = BY_LLMAPI_TYPE.get(str(config.get("decoding_type", "")))
    if name is None:
        raise RepositoryError(f"vLLM has no speculative method for trtspec's {spec.method!r}",
                              hint="vLLM serves draft_model, medusa, eagle/eagle3 and ngram (prompt lookup) "
                                   "drafters; serve this spec with trtspec instead")
    if name in EAGLE3_OF and eagle_version(Path(spec.speculative.heads), RepositoryError) == 3:
        name = EAGLE3_OF[name]
    if name in HEAD_METHODS and spec.speculative.choices:
        raise RepositoryError(f"vLLM's {name} drafts a chain; speculative.choices is a tree of "
                              f"{len(spec.speculative.choices)} nodes",
                              hint="remove speculative.choices (a chain of num_draft_tokens) for the vLLM export")
    return name, config


def _llmapi_probe(spec: Spec) -> Spec:
    """The spec as the LLM-API mapping is asked about it: at LLMAPI_PROBE_VERSION (see the module docstring)."""
    t = spec.runtime.trtllm
    runtime = spec.runtime.model_copy(update={"trtllm": t.model_copy(update={"version": LLMAPI_PROBE_VERSION})})
    return spec.model_copy(update={"runtime": runtime})


# vLLM's SuffixDecoding keys (vllm/config/speculative.py, SpeculativeConfig.suffix_decoding_*; read at vLLM
# main 002e77c, the same four keys the suffix proposer reads in vllm/v1/spec_decode/suffix_decoding.py as
# documented for tags v0.14.0 and v0.19.1) <- trtspec's [speculative.suffix]
SUFFIX_KEYS = {"suffix_decoding_max_tree_depth": "max_depth", "suffix_decoding_max_cached_requests": "cache_requests",
               "suffix_decoding_max_spec_factor": "max_spec_factor", "suffix_decoding_min_token_prob": "min_token_prob"}


def suffix_options(spec: Spec) -> dict[str, Any]:
    """[speculative.suffix] as vLLM's suffix_decoding_* keys. vLLM speculates max_spec_factor * match length
    tokens with no offset, and bounds its global cache by requests only: a spec that sets max_spec_offset is
    refused (the export would speculate differently), cache_tokens has no vLLM key (its bound is on requests)."""
    s = spec.speculative.suffix
    if s.max_spec_offset != 0:
        raise RepositoryError(f"vLLM's suffix has no speculation offset; speculative.suffix.max_spec_offset = "
                              f"{s.max_spec_offset}", hint="set max_spec_offset = 0 for the vLLM export")
    return {key: getattr(s, ours) for key, ours in SUFFIX_KEYS.items()}


def speculative_config(spec: Spec) -> dict[str, Any] | None:
    """vLLM's --speculative-config for the spec (None: plain decoding)."""
    name, llmapi = vllm_method(spec)
    if name is None:
        return None
    s = spec.speculative
    config: dict[str, Any] = {"method": name, "num_speculative_tokens": s.num_draft_tokens}
    if name == "draft_model":
        config["model"] = str(Path(s.draft).resolve())
        config["draft_tensor_parallel_size"] = spec.gpu.tensor_parallel  # 1 or the target's
    elif name in HEAD_METHODS:
        config["model"] = str(Path(s.heads).resolve())
    elif name == "suffix":
        config.update(suffix_options(spec))
    else:  # ngram: the longest n-gram matched at the end of the sequence, as the LLM API's drafter
        config["prompt_lookup_max"] = int(llmapi.get("max_matching_ngram_size") or 2)
        shortest = s.ngram.min_matching if s.method == "ngram" else 1
        config["prompt_lookup_min"] = min(shortest, config["prompt_lookup_max"])
    if s.schedule:
        config["num_speculative_tokens_per_batch_size"] = batch_ranges(spec)
    return config


def batch_ranges(spec: Spec) -> list[list[int]]:
    """speculative.schedule as vLLM's inclusive (range_start, range_end, k) list up to limits.max_batch_size,
    floored at SCHEDULE_FLOOR like draft_len_schedule."""
    s, top = spec.speculative, spec.limits.max_batch_size
    bands = sorted({1: s.num_draft_tokens, **(s.schedule or {})}.items())
    out = []
    for i, (start, k) in enumerate(bands):
        end = bands[i + 1][0] - 1 if i + 1 < len(bands) else top
        out.append([start, end, max(SCHEDULE_FLOOR, k)])
    return out


def command(spec: Spec, host: str = "127.0.0.1", port: int | None = None) -> list[str]:
    """`vllm serve ...` as an argv list."""
    lim, gpu = spec.limits, spec.gpu
    argv = ["vllm", "serve", str(Path(spec.model.target).resolve()),
            "--tokenizer", str(Path(spec.tokenizer_dir).resolve()),
            "--served-model-name", spec.name, "--dtype", spec.model.dtype,
            "--tensor-parallel-size", str(gpu.tensor_parallel), "--pipeline-parallel-size", str(gpu.pipeline_parallel),
            "--max-num-seqs", str(lim.max_batch_size), "--max-model-len", str(lim.max_seq_len),
            "--host", host, "--port", str(port or spec.serving.http_port), "--api-key", "$VLLM_API_KEY"]
    config = speculative_config(spec)
    if config is not None:
        argv += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return argv


def shell(argv: list[str]) -> str:
    """The argv as one shell line; $VLLM_API_KEY stays a variable (double quotes), everything else quoted."""
    return " ".join('"$VLLM_API_KEY"' if a == "$VLLM_API_KEY" else shlex.quote(a) for a in argv)


def export(spec: Spec, host: str = "127.0.0.1", port: int | None = None) -> dict[str, Any]:
    argv = command(spec, host, port)
    config = speculative_config(spec)
    return {"name": spec.name, "method": spec.method, "vllm_method": config and config["method"],
            "speculative_config": config, "argv": argv, "command": shell(argv),
            "note": NOTES.get(config["method"]) if config else None}
