"""The `trtllm-llmapi` repository: one python-backend model `tensorrt_llm` whose `1/model.yaml`
holds the `LLM(...)` arguments, `speculative_config` included, and `triton_config` (NVIDIA/TensorRT-LLM
`triton_backend/all_models/llmapi/tensorrt_llm/1/model.yaml`). No engine is built: the PyTorch backend loads HF
checkpoints.

The method's arguments (`method_args`: speculative_config, disable_overlap_scheduler, ...) come from the runtime's
method table (trtspec/backends/trtllm_llmapi_methods.py: llm_args), spelled for runtime.trtllm.version by
trtspec/backends/trtllm_versions.py, which also says what of each version was read and what was not:

    TensorRT-LLM   drafter key              draft-model        eagle (EAGLE-3 heads only)
    1.0, 1.1, 1.2  speculative_model_dir    DraftTarget        Eagle + eagle3_one_model
    later          speculative_model        Draft_Target       Eagle3

ngram is decoding_type NGram, suffix SA (TensorRT-LLM >= 1.3.0rc27); medusa and lookahead are refused (TensorRT
engine only). tests/trtllm/test_llmapi_keys.py checks every key this module writes against TensorRT-LLM's field
lists (tests/data/upstream/trtllm_llm_args.json).

`1/model.py` and `1/helpers.py` come from the container (/app/all_models/llmapi/tensorrt_llm/1/). Relocatable:
model.yaml's checkpoint paths are relative to the repository when it is written for a place (`repo_dir`), and
trtspec's `1/trtspec_model.py` (config.pbtxt's default_model_filename; source: llmapi_model.py) makes them
absolute at load ($TRTSPEC_CHECKPOINT_DIR overrides them) before it hands over to the container's model.py.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.repository.trtllm import io
from trtspec.repository.trtllm.common import CONTAINER_MODELS, add_rows, cpu_instances, render
from trtspec.spec import Spec

FLAVOUR = "trtllm-llmapi"
MODEL = "tensorrt_llm"
UPSTREAM_FILES = {MODEL: ["1/model.py", "1/helpers.py"]}
ENTRY = "trtspec_model.py"  # trtspec's entry point (llmapi_model.py), which loads the container's model.py


def _where(path: Path, repo_dir: Path | None) -> str:
    """A checkpoint path as model.yaml holds it: relative to the repository `repo_dir` (None: absolute)."""
    path = Path(path).resolve()
    return str(path) if repo_dir is None else os.path.relpath(path, Path(repo_dir).resolve())


def model_yaml(spec: Spec, method_args: dict[str, Any], repo_dir: Path | None = None) -> dict[str, Any]:
    """The LLM(...) arguments, with the method's (`method_args`: speculative_config, ...); checkpoint paths
    relative to `repo_dir` when given (trtspec_model.py resolves them), else absolute."""
    lim = spec.limits
    data: dict[str, Any] = {
        "model": _where(spec.model.target, repo_dir),
        "tokenizer": _where(spec.tokenizer_dir, repo_dir),
        "backend": "pytorch",
        "dtype": spec.trtllm_dtype,
        "tensor_parallel_size": spec.gpu.tensor_parallel,
        "pipeline_parallel_size": spec.gpu.pipeline_parallel,
        "max_batch_size": lim.max_batch_size,
        "max_input_len": lim.max_input_len,
        "max_seq_len": lim.max_seq_len,
        "kv_cache_config": {"free_gpu_memory_fraction": spec.runtime.trtllm.kv_cache_free_gpu_mem_fraction or 0.9},
    }
    data.update(method_args)  # speculative_config (spelled for the version), ...
    if data.get("speculative_config"):
        sc = dict(data["speculative_config"])
        for key in ("speculative_model", "speculative_model_dir"):
            if sc.get(key):
                sc[key] = _where(Path(sc[key]), repo_dir)
        data["speculative_config"] = sc
    # Batching happens inside the LLM; the python model itself takes one request at a time
    # (upstream default, "The current implementation does not support batching").
    data["triton_config"] = {"max_batch_size": 0, "decoupled": spec.serving.streaming}
    return data


def entry_source() -> str:
    """trtspec_model.py: the repository's entry point (trtspec/repository/trtllm/llmapi_model.py)."""
    return resources.files("trtspec.repository.trtllm").joinpath("llmapi_model.py").read_text(encoding="utf-8")


def render_llmapi_repository(spec: Spec, method_args: dict[str, Any], repo_dir: Path | None = None) -> dict[str, str]:
    """The repository's files for the spec and its method's LLM(...) arguments (trtspec/backends/
    trtllm_llmapi_methods.py: llm_args); written for `repo_dir`, its checkpoint paths are relative to it. The config is
    complete (max_batch_size 0, decoupled as serving.streaming): the server runs with
    --disable-auto-complete-config, as upstream's launch_triton_server.py runs it."""
    cfg = mc.ModelConfig(name=MODEL, backend="python", default_model_filename=ENTRY, max_batch_size=0)
    cfg.model_transaction_policy.decoupled = spec.serving.streaming
    cpu_instances(cfg, 1)
    add_rows(cfg, io.LLMAPI_INPUTS, io.LLMAPI_OUTPUTS, {})
    data = model_yaml(spec, method_args, repo_dir)
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
    return render({MODEL: cfg}, {f"{MODEL}/1/model.yaml": text, f"{MODEL}/1/{ENTRY}": entry_source()}, manifest)
