"""The `trtllm-llmapi` repository: one python-backend model `tensorrt_llm` whose `1/model.yaml`
holds the `LLM(...)` arguments, `speculative_config` included, and `triton_config`
(reference/tensorrt-llm.md §4.3). No engine is built: the PyTorch backend loads HF checkpoints.

    method        speculative_config (each method's module says: `llmapi_options`, trtspec/methods/)
    draft-model   decoding_type: Draft_Target, max_draft_len: K, speculative_model: <draft dir>
    eagle         decoding_type: Eagle3, max_draft_len: K, speculative_model: <heads dir>  (EAGLE-3 heads only)
    none          (none)
    medusa        refused: the PyTorch backend does not support Medusa (TensorRT engine path only)
    ngram         decoding_type: NGram (prompt-lookup n-gram drafting), see methods/ngram.ngram_config
    suffix        decoding_type: SA (TensorRT-LLM >= 1.3.0rc27; refused before), see methods/suffix.py
    lookahead     refused: LookaheadDecodingConfig is TensorRT-engine only (use runtime trtllm-engine)

`1/model.py` and `1/helpers.py` come from the container (/app/all_models/llmapi/tensorrt_llm/1/).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from tritonclient.grpc import model_config_pb2 as mc

from trtspec import methods
from trtspec.repository.trtllm import io
from trtspec.repository.trtllm.common import CONTAINER_MODELS, add_rows, cpu_instances, render
from trtspec.spec import Spec, draft_len_schedule

FLAVOUR = "trtllm-llmapi"
MODEL = "tensorrt_llm"
UPSTREAM_FILES = {MODEL: ["1/model.py", "1/helpers.py"]}


def speculative_config(spec: Spec) -> dict[str, Any] | None:
    """The method's speculative_config (None: plain decoding); a method the LLM API cannot serve is a
    RepositoryError saying why."""
    return methods.get(spec.method).llmapi_options(spec).get("speculative_config")


def model_yaml(spec: Spec) -> dict[str, Any]:
    lim = spec.limits
    data: dict[str, Any] = {
        "model": str(Path(spec.model.target).resolve()),
        "tokenizer": str(Path(spec.tokenizer_dir).resolve()),
        "backend": "pytorch",
        "dtype": spec.model.dtype,
        "tensor_parallel_size": spec.gpu.tensor_parallel,
        "pipeline_parallel_size": spec.gpu.pipeline_parallel,
        "max_batch_size": lim.max_batch_size,
        "max_input_len": lim.max_input_len,
        "max_seq_len": lim.max_seq_len,
        "kv_cache_config": {"free_gpu_memory_fraction": spec.runtime.trtllm.kv_cache_free_gpu_mem_fraction or 0.9},
    }
    data.update(methods.get(spec.method).llmapi_options(spec))  # speculative_config, ...
    schedule = draft_len_schedule(spec)  # speculative.schedule, floored at 1 (trtspec.spec.draft_len_schedule)
    if schedule and data.get("speculative_config"):
        data["speculative_config"] = {**data["speculative_config"], "draft_len_schedule": schedule}
    # Batching happens inside the LLM; the python model itself takes one request at a time
    # (upstream default, "The current implementation does not support batching").
    data["triton_config"] = {"max_batch_size": 0, "decoupled": spec.serving.streaming}
    return data


def render_llmapi_repository(spec: Spec) -> dict[str, str]:
    cfg = mc.ModelConfig(name=MODEL, backend="python")
    cpu_instances(cfg, 1)
    add_rows(cfg, io.LLMAPI_INPUTS, io.LLMAPI_OUTPUTS, {})
    data = model_yaml(spec)
    text = ("# LLM(...) arguments for TensorRT-LLM's llmapi Triton model, written by trtspec.\n"
            "# triton_config is read by model.py; everything else is passed to tensorrt_llm.LLM.\n"
            + yaml.safe_dump(data, sort_keys=False))
    manifest = {
        "flavour": FLAVOUR, "name": spec.name, "method": spec.method, "entry_model": MODEL, "models": [MODEL],
        "upstream_files": {"source_root": f"{CONTAINER_MODELS}/llmapi", "files": UPSTREAM_FILES,
                           "copy_from": {MODEL: [f"{CONTAINER_MODELS}/llmapi/{MODEL}/{f}"
                                                 for f in UPSTREAM_FILES[MODEL]]},
                           "how": "trtspec repo install-upstream <repo> (inside the container)"},
        "trtllm_version": spec.runtime.trtllm.version,
    }
    return render({MODEL: cfg}, {f"{MODEL}/1/model.yaml": text}, manifest)
