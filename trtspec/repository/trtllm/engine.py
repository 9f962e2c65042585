"""The `trtllm-engine` repository: TensorRT-LLM's `inflight_batcher_llm` layout, every config
built as a `ModelConfig` protobuf with every template parameter resolved from the spec.

    model_repository/<name>/
      preprocessing/        python   tokenizer            1/model.py from the container
      tensorrt_llm/         tensorrtllm (C++)  target engine
      tensorrt_llm_draft/   tensorrtllm (C++)  draft engine (method draft-model only)
      postprocessing/       python   detokenizer          1/model.py from the container
      tensorrt_llm_bls/     python   BLS; does draft-model speculation (num_draft_tokens)
                                                          1/model.py, 1/lib/*.py from the container
      <ensemble_name>/      ensemble preprocessing -> tensorrt_llm -> postprocessing
      trtspec.repo.json     what was emitted, the entry model, which files come from the container

NVIDIA's python `model.py` files are not copied into trtspec: the Triton TRT-LLM container ships
them under /app/all_models/inflight_batcher_llm/<model>/1/. `trtspec.repository.trtllm.upstream`
copies them in (the serving step and ci/Dockerfile do); see UPSTREAM_FILES.

Parameters deliberately left out (the backend's default is what we want, and an empty string
would be parsed as a value): see OMITTED_PARAMETERS.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonclient.grpc import model_config_pb2 as mc

from trtspec.errors import RepositoryError
from trtspec.repository import pbtxt
from trtspec.repository.trtllm import io
from trtspec.repository.trtllm.common import CONTAINER_MODELS, add_rows, cpu_instances, dynamic_batching, render
from trtspec.spec import Spec

if TYPE_CHECKING:  # (the builders pass the memory plan and the method's row in: a repository does not reach up)
    from trtspec.builders.trtllm.memory import MemoryPlan
    from trtspec.builders.trtllm.method import EngineMethod

FLAVOUR = "trtllm-engine"
TEMPLATE_GROUP = "inflight_batcher_llm"
EXECUTOR_WORKER = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
TARGET, DRAFT, PRE, POST, BLS = "tensorrt_llm", "tensorrt_llm_draft", "preprocessing", "postprocessing", \
    "tensorrt_llm_bls"

UPSTREAM_FILES = {
    PRE: ["1/model.py"],
    POST: ["1/model.py"],
    BLS: ["1/model.py", "1/lib/decode.py", "1/lib/triton_decoder.py"],
}

OMITTED_PARAMETERS = {
    "encoder_model_path": "decoder-only models have no encoder engine",
    "cross_kv_cache_fraction": "encoder-decoder models only",
    "sink_token_length": "no StreamingLLM attention sinks",
    "lora_prefetch_dir": "no LoRA adapters to prefetch (an empty string would be read as a directory)",
    "enable_trt_overlap": "deprecated and commented out in the upstream template",
    "participant_ids": "set only in fast-logits orchestrator mode (draft-model with use_draft_logits)",
    "max_tokens_in_paged_kv_cache": "set only when target and draft share a GPU (memory plan); "
                                    "otherwise kv_cache_free_gpu_mem_fraction decides",
    "medusa_choices": "method medusa only",
    "eagle_choices": "method eagle only",
    "lookahead_window_size": "method lookahead only",
    "lookahead_ngram_size": "method lookahead only",
    "lookahead_verification_set_size": "method lookahead only",
}

# Where the upstream templates differ between TensorRT-LLM versions, harmless for what trtspec renders today
# (tracked in the repository manifest; tests/trtllm/test_trtllm_upstream_facts.py pins trtspec's side):
TEMPLATE_DRIFT = {
    "preprocessing IMAGES": "newer templates (TensorRT-LLM 08dc37e3) add an optional IMAGES input (pixtral); "
                            "tensorrtllm_backend r25.05's has none. trtspec declares none: an optional input "
                            "nobody sends changes nothing",
    "preprocessing hf_model_path": "newer templates add the parameter hf_model_path (multimodal); r25.05's "
                                   "has none. trtspec sets none: text-only models do not read it",
    "tensorrt_llm enable_trt_overlap": "commented out as deprecated (\"doesn't have any effect\") in v0.15-r25.05, "
                                       "un-commented in a later template; trtspec omits it (OMITTED_PARAMETERS)",
}



def participants(spec: Spec) -> dict[str, list[int]]:
    """MPI ranks per model in fast-logits mode: 0 = orchestrator, then the draft, then the target."""
    tp, ws = spec.gpu.tensor_parallel, spec.world_size
    return {DRAFT: list(range(1, 1 + tp)), TARGET: list(range(1 + tp, 1 + tp + ws))}


def engine_max_seq_len(spec: Spec, method: EngineMethod, role: str) -> int:
    """What trtllm-build makes max_seq_len: input + output, + what the method adds to the target
    (max_draft_len, + num_eagle_layers for EAGLE: TensorRT-LLM's build config)."""
    n = spec.limits.max_seq_len
    return n + method.extra_seq_len(spec) if role == "target" else n


def _csv(ids: list[int]) -> str:
    return ",".join(str(i) for i in ids)


def _bool(v: bool) -> str:
    return "true" if v else "false"


def llm_parameters(spec: Spec, method: EngineMethod, role: str, engine_dir: str, tokenizer_dir: str,
                   memory: MemoryPlan) -> dict[str, Any]:
    """Every `${...}` parameter of tensorrt_llm/config.pbtxt that we set, for target or draft. Draft logits go
    straight from the draft to the target executor when the method says so (`fast_logits`: orchestrator mode,
    spawned processes disabled, explicit participant_ids)."""
    dtm = method.draft_engine(spec)
    mm = memory.model(role)
    reuse = method.paged_context_fmha  # engines built with --use_paged_context_fmha enable
    p: dict[str, Any] = {
        "max_beam_width": "1",
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": engine_dir,
        "max_attention_window_size": str(engine_max_seq_len(spec, method, role)),
        "batch_scheduler_policy": "guaranteed_no_evict",
        "kv_cache_free_gpu_mem_fraction": f"{mm.kv_cache_free_gpu_mem_fraction:g}",
        "kv_cache_host_memory_bytes": "0",
        "kv_cache_onboard_blocks": "true",
        # The BLS drives draft-model speculation by slicing output_ids as prompt + generation.
        "exclude_input_in_output": _bool(not dtm),
        "cancellation_check_period_ms": "100",
        "stats_check_period_ms": "100",
        "iter_stats_max_iterations": "1000",
        "request_stats_max_iterations": "0",
        "enable_kv_cache_reuse": _bool(reuse),
        "normalize_log_probs": "true",
        "enable_chunked_context": "false",
        "gpu_device_ids": _csv(mm.devices),
        "num_nodes": "1",
        "lora_cache_optimal_adapter_size": "8",
        "lora_cache_max_adapter_size": "64",
        "lora_cache_gpu_memory_fraction": "0.05",
        "lora_cache_host_memory_bytes": str(1 << 30),
        "decoding_mode": method.decoding_mode,
        "executor_worker_path": EXECUTOR_WORKER,
        "gpu_weights_percent": "1.0",
        "enable_context_fmha_fp32_acc": "false",
        # TensorRT-LLM's own runner turns multi-block mode off for Medusa and EAGLE (unsupported there)
        "multi_block_mode": _bool(method.multi_block),
        "cuda_graph_mode": "false",
        "cuda_graph_cache_size": "0",
        "speculative_decoding_fast_logits": _bool(method.fast_logits(spec)),
        "tokenizer_dir": tokenizer_dir,
        "guided_decoding_backend": "",
        "xgrammar_tokenizer_info_path": "",
    }
    if mm.max_tokens_in_paged_kv_cache:
        p["max_tokens_in_paged_kv_cache"] = str(mm.max_tokens_in_paged_kv_cache)
    if method.fast_logits(spec):
        p["participant_ids"] = _csv(participants(spec)[TARGET if role == "target" else DRAFT])
    p.update(method.backend_parameters(spec, role))  # medusa_choices, eagle_choices, lookahead_*
    return p


def _llm_config(spec: Spec, name: str, decoupled: bool, parameters: dict[str, Any]) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=name, backend="tensorrtllm", max_batch_size=spec.limits.max_batch_size)
    cfg.model_transaction_policy.decoupled = decoupled
    dynamic_batching(cfg, spec.limits.max_batch_size, 0, 0)
    add_rows(cfg, io.TENSORRT_LLM_INPUTS, io.TENSORRT_LLM_OUTPUTS, TYPES)
    cpu_instances(cfg, 1)
    pbtxt.set_parameters(cfg, parameters)
    return cfg


TYPES = {"LOGITS": "TYPE_FP32", "PROMPT_TABLE": "TYPE_FP16", "ENCODER_FEATURES": "TYPE_FP16"}


def _preprocessing(spec: Spec, tokenizer_dir: str, engine_dir: str) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=PRE, backend="python", max_batch_size=spec.limits.max_batch_size)
    dynamic_batching(cfg, spec.limits.max_batch_size, 0, 0)
    add_rows(cfg, io.PREPROCESSING_INPUTS, io.PREPROCESSING_OUTPUTS, TYPES)
    pbtxt.set_parameters(cfg, {"tokenizer_dir": tokenizer_dir, "add_special_tokens": "true",
                               "multimodal_model_path": "", "gpt_model_path": engine_dir, "max_num_images": "0"})
    cpu_instances(cfg, spec.serving.instances)
    return cfg


def _postprocessing(spec: Spec, tokenizer_dir: str) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=POST, backend="python", max_batch_size=spec.limits.max_batch_size)
    dynamic_batching(cfg, None, 0, None)
    add_rows(cfg, io.POSTPROCESSING_INPUTS, io.POSTPROCESSING_OUTPUTS, TYPES)
    pbtxt.set_parameters(cfg, {"tokenizer_dir": tokenizer_dir, "skip_special_tokens": "true"})
    cpu_instances(cfg, spec.serving.instances)
    return cfg


def _bls(spec: Spec, decoupled: bool, draft: bool) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=BLS, backend="python", max_batch_size=spec.limits.max_batch_size)
    cfg.model_transaction_policy.decoupled = decoupled
    add_rows(cfg, io.BLS_INPUTS, io.TEXT_OUTPUTS, TYPES)
    pbtxt.set_parameters(cfg, {"accumulate_tokens": "false", "tensorrt_llm_model_name": TARGET,
                               "tensorrt_llm_draft_model_name": DRAFT if draft else "",
                               "multimodal_encoders_name": ""})
    cpu_instances(cfg, spec.serving.instances)
    return cfg


def _ensemble(spec: Spec) -> mc.ModelConfig:
    cfg = mc.ModelConfig(name=spec.serving.ensemble_name, platform="ensemble",
                         max_batch_size=spec.limits.max_batch_size)
    add_rows(cfg, io.ENSEMBLE_INPUTS, io.TEXT_OUTPUTS, TYPES)
    sched = cfg.ensemble_scheduling
    for model, ins, outs in ((PRE, io.PRE_IN, io.PRE_OUT), (TARGET, io.LLM_IN, io.LLM_OUT),
                             (POST, io.POST_IN, io.POST_OUT)):
        step = sched.step.add(model_name=model, model_version=-1)
        for k, v in ins:
            step.input_map[k] = v
        for k, v in outs:
            step.output_map[k] = v
    return cfg


def render_engine_repository(spec: Spec, method: EngineMethod, *, engine_dirs: dict[str, str], memory: MemoryPlan,
                             tokenizer_dir: str | None = None) -> dict[str, str]:
    """{relative path: text} of the whole repository (nothing is written) for the spec and its method's row
    (trtspec/backends/trtllm_engine_methods.py)."""
    if spec.serving.ensemble_name in (PRE, POST, TARGET, DRAFT, BLS):
        raise RepositoryError(f"serving.ensemble_name {spec.serving.ensemble_name!r} clashes with a model name",
                              hint="choose another ensemble name")
    if memory.problems and any("cannot size" in p for p in memory.problems):
        raise RepositoryError(f"memory plan incomplete: {memory.problems[0]}", hint="fix the checkpoint paths")
    tok = str(Path(tokenizer_dir or spec.tokenizer_dir).resolve())
    dtm = method.draft_engine(spec)
    decoupled = spec.serving.streaming and not dtm
    configs: dict[str, mc.ModelConfig] = {
        PRE: _preprocessing(spec, tok, engine_dirs["target"]),
        TARGET: _llm_config(spec, TARGET, decoupled, llm_parameters(spec, method, "target", engine_dirs["target"],
                                                                    tok, memory)),
    }
    if dtm:
        configs[DRAFT] = _llm_config(spec, DRAFT, False,
                                     llm_parameters(spec, method, "draft", engine_dirs["draft"], tok, memory))
    configs[POST] = _postprocessing(spec, tok)
    configs[BLS] = _bls(spec, decoupled, dtm)
    configs[spec.serving.ensemble_name] = _ensemble(spec)
    upstream = {m: [f"{CONTAINER_MODELS}/{TEMPLATE_GROUP}/{m}/{f}" for f in files] for m, files in
                UPSTREAM_FILES.items()}
    manifest = {
        "flavour": FLAVOUR, "name": spec.name, "method": spec.method,
        "entry_model": BLS if dtm else spec.serving.ensemble_name,
        "models": sorted(configs),
        "engines": engine_dirs, "tokenizer_dir": tok,
        "upstream_files": {"source_root": f"{CONTAINER_MODELS}/{TEMPLATE_GROUP}", "files": UPSTREAM_FILES,
                           "copy_from": upstream,
                           "how": "trtspec repo install-upstream <repo> (run inside the Triton "
                                  "TRT-LLM container), or the cp lines in ci/Dockerfile"},
        "omitted_parameters": OMITTED_PARAMETERS,
        "template_drift": TEMPLATE_DRIFT,
        "fast_logits": method.fast_logits(spec),
        "trtllm_version": spec.runtime.trtllm.version,
        "memory": memory.to_dict(),
    }
    return render(configs, {}, manifest)
