"""Emit the Triton model repository for the torch runtime.

    model_repository/<name>/
      preprocessing/   config.pbtxt, 1/model.py   text -> ids          (python backend)
      tensorrt_llm/    config.pbtxt, 1/model.py   SpecEngine, decoupled (python backend)
      postprocessing/  config.pbtxt, 1/model.py   ids -> text          (python backend)
      ensemble/        config.pbtxt, 1/           the three in a row   (platform ensemble)

Names and I/O follow tensorrtllm_backend's `inflight_batcher_llm` so that clients written for it
(text_input / max_tokens / stream ... -> text_output) work unchanged. Every config.pbtxt is a
`ModelConfig` protobuf (trtspec.repository.pbtxt), never a filled template. The models find the
engine through the `engine_dir` parameter, relative to the repository root (no absolute paths of
the build machine), which `$TRTSPEC_ENGINE_DIR` overrides.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from importlib import resources
from pathlib import Path
from typing import Any

from trtspec.errors import RepositoryError
from trtspec.names import check_name, inside
from trtspec.repository import pbtxt
from trtspec.repository.pbtxt import tensor
from trtspec.spec import Spec

MODEL_SOURCES = {  # role -> module in trtspec.repository.torch_models copied into <model>/1/model.py
    "preprocessing": "preprocessing.py",
    "generation": "tensorrt_llm.py",
    "postprocessing": "postprocessing.py",
}

# The ensemble's request inputs (name, type, dims, optional) and where each goes. text_input and
# max_tokens are required, yet marked optional: Triton 2.51 admits a request that lacks a required
# input but carries an optional one, and its ensemble then skips the step that needs it and answers
# with an empty success. So every input also goes to `preprocessing` (the others as PRESENCE_INPUTS),
# which then runs for any request with an input and names a missing text_input or max_tokens.
ENSEMBLE_INPUTS = [
    tensor("text_input", "STRING", [1], optional=True),
    tensor("max_tokens", "INT32", [1], optional=True),
    tensor("stream", "BOOL", [1], optional=True),
    tensor("temperature", "FP32", [1], optional=True),
    tensor("top_k", "INT32", [1], optional=True),
    tensor("top_p", "FP32", [1], optional=True),
    tensor("seed", "UINT64", [1], optional=True),
    tensor("end_id", "INT32", [1], optional=True),
    tensor("stop_words", "STRING", [-1], optional=True),
    tensor("num_draft_tokens", "INT32", [1], optional=True),
    # a routed spec's task: picks the request's drafter (model_repository/README.md, "Routing"); others ignore it
    tensor("task", "STRING", [1], optional=True),
    # a chat instead of text_input: JSON [{"role", "content"}, ...], rendered by preprocessing with the
    # tokenizer's chat template (model_repository/README.md, "Chat")
    tensor("messages", "STRING", [1], optional=True),
]
ENSEMBLE_OUTPUTS = [
    tensor("text_output", "STRING", [-1]),
    tensor("acceptance_rate", "FP32", [1]),
    tensor("total_accepted_draft_tokens", "INT32", [1]),
    tensor("total_draft_tokens", "INT32", [1]),
    tensor("num_output_tokens", "INT32", [1]),
    tensor("num_steps", "INT32", [1]),
]
# Per-request counters: generation output -> postprocessing input -> ensemble output.
COUNTERS = [
    ("acceptance_rate", "ACCEPTANCE_RATE", "FP32"),
    ("total_accepted_draft_tokens", "TOTAL_ACCEPTED_DRAFT_TOKENS", "INT32"),
    ("total_draft_tokens", "TOTAL_DRAFT_TOKENS", "INT32"),
    ("num_output_tokens", "NUM_OUTPUT_TOKENS", "INT32"),
    ("num_steps", "NUM_STEPS", "INT32"),
]
# Ensemble input -> generation-model input (the rest go through preprocessing).
DIRECT_TO_GENERATION = {
    "stream": "streaming", "temperature": "temperature", "top_k": "runtime_top_k", "top_p": "runtime_top_p",
    "seed": "seed", "end_id": "end_id", "stop_words": "stop_words", "num_draft_tokens": "num_draft_tokens",
    "task": "task",
}
# Ensemble input -> preprocessing input that only makes the step run (see ENSEMBLE_INPUTS).
PRESENCE_INPUTS = {name: name.upper() for name in DIRECT_TO_GENERATION}


@dataclasses.dataclass(frozen=True)
class ModelNames:
    """Names of the four models; distinct generation/ensemble names let several deployments share
    one repository (and its preprocessing/postprocessing, when they share the tokenizer and limits)."""

    preprocessing: str = "preprocessing"
    generation: str = "tensorrt_llm"
    postprocessing: str = "postprocessing"
    ensemble: str = "ensemble"

    def __post_init__(self) -> None:
        """Each name becomes a model directory: one plain path component, and no two alike (defence in
        depth behind the spec's own check; ModelNames are also made directly, e.g. for shared repositories)."""
        for role, name in self.to_dict().items():
            check_name(name, f"model name ({role})")
        if len(set(self.to_dict().values())) < 4:
            raise RepositoryError(f"model names must differ: {self.to_dict()}", hint="give each model its own name")

    @classmethod
    def for_spec(cls, spec: Spec) -> ModelNames:
        return cls(ensemble=spec.serving.ensemble_name)

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Repository:
    root: Path
    names: ModelNames
    engine_dir_param: str

    def to_dict(self) -> dict[str, Any]:
        return {"root": str(self.root), "models": self.names.to_dict(), "engine_dir": self.engine_dir_param}


def engine_dir_parameter(engine_dir: Path, repository_root: Path) -> str:
    """`engine_dir` as the models read it: relative to the repository root when possible."""
    engine_dir, repository_root = Path(engine_dir).resolve(), Path(repository_root).resolve()
    try:
        return Path(os.path.relpath(engine_dir, repository_root)).as_posix()
    except ValueError:  # another drive (Windows): keep it absolute
        return engine_dir.as_posix()


def _instance_kind(spec: Spec) -> int:
    return pbtxt.mc.ModelInstanceGroup.KIND_GPU if spec.runtime.device == "cuda" else \
        pbtxt.mc.ModelInstanceGroup.KIND_CPU


def _python_model(name: str, spec: Spec, inputs: list, outputs: list, params: dict[str, Any], *,
                  count: int = 1, kind: int | None = None) -> pbtxt.ModelConfig:
    config = pbtxt.ModelConfig(name=name, backend="python", max_batch_size=spec.limits.max_batch_size)
    pbtxt.add_inputs(config, inputs)
    pbtxt.add_outputs(config, outputs)
    config.instance_group.add(count=count, kind=pbtxt.mc.ModelInstanceGroup.KIND_CPU if kind is None else kind)
    pbtxt.set_parameters(config, params)
    return config


def preprocessing_config(spec: Spec, names: ModelNames, engine_dir: str) -> pbtxt.ModelConfig:
    return _python_model(
        names.preprocessing, spec,
        [tensor("QUERY", "STRING", [1], optional=True), tensor("REQUEST_OUTPUT_LEN", "INT32", [1], optional=True),
         tensor("MESSAGES", "STRING", [1], optional=True)]
        + [dict(t, name=PRESENCE_INPUTS[t["name"]]) for t in ENSEMBLE_INPUTS if t["name"] in PRESENCE_INPUTS],
        [tensor("INPUT_ID", "INT32", [-1]), tensor("REQUEST_INPUT_LEN", "INT32", [1]),
         tensor("REQUEST_OUTPUT_LEN", "INT32", [1]), tensor("IN_BAND_ERRORS", "BOOL", [1])],
        {"engine_dir": engine_dir, "tokenizer_dir": "target", "add_special_tokens": True,
         "max_input_len": spec.limits.max_input_len, "max_output_len": spec.limits.max_output_len,
         "request_inputs": ",".join(t["name"] for t in ENSEMBLE_INPUTS)},
        count=spec.serving.instances,
    )


def generation_config(spec: Spec, names: ModelNames, engine_dir: str) -> pbtxt.ModelConfig:
    s = spec.speculative
    config = _python_model(
        names.generation, spec,
        [tensor("input_ids", "INT32", [-1]), tensor("input_lengths", "INT32", [1]),
         tensor("request_output_len", "INT32", [1]),
         tensor("end_id", "INT32", [1], optional=True),
         tensor("temperature", "FP32", [1], optional=True),
         tensor("runtime_top_k", "INT32", [1], optional=True),
         tensor("runtime_top_p", "FP32", [1], optional=True),
         tensor("seed", "UINT64", [1], optional=True),
         tensor("streaming", "BOOL", [1], optional=True),
         tensor("stop_words", "STRING", [-1], optional=True),
         tensor("num_draft_tokens", "INT32", [1], optional=True),
         tensor("task", "STRING", [1], optional=True),
         tensor("in_band_errors", "BOOL", [1], optional=True)],
        [tensor("output_ids", "INT32", [-1, -1]), tensor("sequence_length", "INT32", [-1]),
         tensor("context_ids", "INT32", [-1]), tensor("is_final", "BOOL", [1]), tensor("stop_trim", "INT32", [1]),
         tensor("stop_words_out", "STRING", [-1])]
        + [tensor(name, type_, [1]) for name, _, type_ in COUNTERS] + [tensor("error", "STRING", [1])],
        # decoding_mode / max_draft_len are for reading only (as in tensorrtllm_backend's config); the
        # engine takes everything from <engine_dir>/spec.json
        {"engine_dir": engine_dir, "decoding_mode": s.method, "max_draft_len": s.num_draft_tokens},
        count=spec.serving.instances, kind=_instance_kind(spec),
    )
    config.model_transaction_policy.decoupled = True
    return config


def postprocessing_config(spec: Spec, names: ModelNames, engine_dir: str) -> pbtxt.ModelConfig:
    return _python_model(
        names.postprocessing, spec,
        [tensor("TOKENS_BATCH", "INT32", [-1, -1]), tensor("SEQUENCE_LENGTH", "INT32", [-1]),
         tensor("CONTEXT_IDS", "INT32", [-1], optional=True), tensor("IS_FINAL", "BOOL", [1], optional=True),
         tensor("STOP_TRIM", "INT32", [1], optional=True), tensor("STOP_WORDS", "STRING", [-1], optional=True)]
        + [tensor(upper, type_, [1], optional=True) for _, upper, type_ in COUNTERS]
        + [tensor("ERROR", "STRING", [1], optional=True)],
        [tensor("OUTPUT", "STRING", [-1])] + [tensor(f"OUT_{upper}", type_, [1]) for _, upper, type_ in COUNTERS],
        {"engine_dir": engine_dir, "tokenizer_dir": "target"},
        count=spec.serving.instances,
    )


def ensemble_config(spec: Spec, names: ModelNames) -> pbtxt.ModelConfig:
    config = pbtxt.ModelConfig(name=names.ensemble, platform="ensemble", max_batch_size=spec.limits.max_batch_size)
    pbtxt.add_inputs(config, ENSEMBLE_INPUTS)
    pbtxt.add_outputs(config, ENSEMBLE_OUTPUTS)
    steps = config.ensemble_scheduling.step
    pre = steps.add(model_name=names.preprocessing, model_version=-1)
    pre.input_map.update({"QUERY": "text_input", "REQUEST_OUTPUT_LEN": "max_tokens", "MESSAGES": "messages"})
    pre.input_map.update({inner: outer for outer, inner in PRESENCE_INPUTS.items()})
    pre.output_map.update({"INPUT_ID": "_INPUT_ID", "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
                           "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN", "IN_BAND_ERRORS": "_IN_BAND_ERRORS"})
    gen = steps.add(model_name=names.generation, model_version=-1)
    gen.input_map.update({"input_ids": "_INPUT_ID", "input_lengths": "_REQUEST_INPUT_LEN",
                          "request_output_len": "_REQUEST_OUTPUT_LEN", "in_band_errors": "_IN_BAND_ERRORS"})
    gen.input_map.update({inner: outer for outer, inner in DIRECT_TO_GENERATION.items()})
    gen.output_map.update({"output_ids": "_TOKENS", "sequence_length": "_SEQUENCE_LENGTH",
                           "context_ids": "_CONTEXT_IDS", "is_final": "_IS_FINAL", "stop_trim": "_STOP_TRIM",
                           # echoed: a step may not take inputs from both the request and a decoupled step
                           "stop_words_out": "_STOP_WORDS", "error": "_ERROR"})
    gen.output_map.update({name: f"_{upper}" for name, upper, _ in COUNTERS})
    post = steps.add(model_name=names.postprocessing, model_version=-1)
    post.input_map.update({"TOKENS_BATCH": "_TOKENS", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH",
                           "CONTEXT_IDS": "_CONTEXT_IDS", "IS_FINAL": "_IS_FINAL", "STOP_TRIM": "_STOP_TRIM",
                           "STOP_WORDS": "_STOP_WORDS", "ERROR": "_ERROR"})
    post.input_map.update({upper: f"_{upper}" for _, upper, _ in COUNTERS})
    post.output_map.update({"OUTPUT": "text_output"})
    post.output_map.update({f"OUT_{upper}": name for name, upper, _ in COUNTERS})
    return config


def model_source(role: str) -> bytes:
    return resources.files("trtspec.repository.torch_models").joinpath(MODEL_SOURCES[role]).read_bytes()


def model_configs(spec: Spec, engine_dir_param: str, names: ModelNames) -> dict[str, pbtxt.ModelConfig]:
    """role -> ModelConfig of every model of the deployment."""
    return {
        "preprocessing": preprocessing_config(spec, names, engine_dir_param),
        "generation": generation_config(spec, names, engine_dir_param),
        "postprocessing": postprocessing_config(spec, names, engine_dir_param),
        "ensemble": ensemble_config(spec, names),
    }


def emit_torch_repository(spec: Spec, out: Path, engine_dir: Path, *, final_root: Path | None = None,
                          names: ModelNames | None = None) -> Repository:
    """Write the four models of `spec` into the repository dir `out`.

    `engine_dir` is the final engine location; the `engine_dir` parameter is written relative to
    `final_root` (where `out` will live, default `out` itself). Other models already in `out`
    are left alone, so several deployments (with distinct `names`) can share one repository."""
    out = Path(out)
    names = names or ModelNames.for_spec(spec)
    param = engine_dir_parameter(engine_dir, final_root or out)
    configs = model_configs(spec, param, names)
    dirs = {role: inside(out, out / config.name) for role, config in configs.items()}  # all checked before any write
    for role, config in configs.items():
        model_dir = dirs[role]
        if model_dir.is_symlink() or model_dir.is_file():
            model_dir.unlink()  # a link is replaced, never followed
        elif model_dir.exists():
            shutil.rmtree(model_dir)
        version = model_dir / "1"
        version.mkdir(parents=True)
        pbtxt.write_config(model_dir, config)
        if role in MODEL_SOURCES:
            (version / "model.py").write_bytes(model_source(role))
        else:  # keep the ensemble's empty version dir in copies, archives and `load_model(files=...)`
            (version / ".gitkeep").write_bytes(b"")
    return Repository(root=(final_root or out).resolve(), names=names, engine_dir_param=param)
