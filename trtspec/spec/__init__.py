"""The deployment spec (`trtspec.toml`): one typed, versioned schema every command reads.

This package validates the spec's SHAPE: pydantic models with `extra="forbid"` (unknown keys, wrong types,
out-of-range values), then the cross-field rules that need nothing but the spec (schema version, lengths,
devices, ports). The rules that need a method or a runtime (each method's own, what a runtime takes of it)
are not here: the composition point above them, trtspec/check.py, passes them in (`rules`, and the registered
method names `speculative.method` takes) and the CLI loads specs through it. Every problem names its key
(dotted path), the value seen and the fix. All problems are collected and raised together as one SpecError
whose `problems` list `trtspec check` prints.

Relative paths resolve against the folder of the spec file.

    schema.py   the pydantic models (Spec and its sections)
    rules.py    Problem, the rules that need nothing but the spec, the K schedule, check_paths
    load.py     load_spec / spec_from_dict: TOML, the schema, the rules passed in
"""

from __future__ import annotations

from trtspec.spec.load import Rules, load_spec, spec_from_dict
from trtspec.spec.rules import (
                                _MISSING,
                                SCHEDULE_FLOOR,
                                TRTLLM_QUANTIZATION,
                                Problem,
                                check_paths,
                                device_problems,
                                draft_len_schedule,
                                drafters_problems,
                                gpu_count_problems,
                                length_problems,
                                model_quantization_problems,
                                quantization_problems,
                                raise_first,
                                schedule_k,
                                schedule_problems,
                                schema_problems,
                                serving_problems,
                                spec_problems,
)
from trtspec.spec.schema import (
                                DEFAULT_SPEC,
                                MAX_DRAFT_TOKENS,
                                SCHEMA_VERSION,
                                AdaptiveSection,
                                CheckpointPath,
                                DrafterSection,
                                DType,
                                GpuSection,
                                GpuType,
                                LimitsSection,
                                LookaheadSection,
                                Method,
                                ModelSection,
                                NgramSection,
                                RouterSection,
                                RuntimeKind,
                                RuntimeSection,
                                Schedule,
                                ServingSection,
                                Spec,
                                SpeculativeSection,
                                SuffixSection,
                                TorchRuntime,
                                TrtllmRuntime,
                                drafter_role,
                                drafter_spec,
)

__all__ = ["DEFAULT_SPEC", "MAX_DRAFT_TOKENS", "SCHEDULE_FLOOR", "SCHEMA_VERSION", "TRTLLM_QUANTIZATION", "_MISSING",
           "AdaptiveSection", "CheckpointPath", "DType", "DrafterSection", "GpuSection", "GpuType", "LimitsSection",
           "LookaheadSection", "Method", "ModelSection", "NgramSection", "Problem", "RouterSection", "Rules",
           "RuntimeKind", "RuntimeSection", "Schedule", "ServingSection", "Spec", "SpeculativeSection", "SuffixSection",
           "TorchRuntime", "TrtllmRuntime", "check_paths", "device_problems", "draft_len_schedule", "drafter_role",
           "drafter_spec", "drafters_problems", "gpu_count_problems", "length_problems", "load_spec",
           "model_quantization_problems", "quantization_problems", "raise_first", "schedule_k", "schedule_problems",
           "schema_problems", "serving_problems", "spec_from_dict", "spec_problems"]
