"""The converter's head layouts: what Medusa heads or an EAGLE-1 head add to the target's TensorRT-LLM
checkpoint (TensorRT-LLM's MedusaForCausalLM / EagleForCausalLM): their config.json keys and each rank's head
tensors. A conversion job's `kind` names its layout; a plain Llama checkpoint (LLAMA) has none. Which method
converts to which kind is the trtllm-engine runtime's method table's (trtspec/backends/trtllm_engine_methods.py).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable

from trtspec.artifacts import heads as layouts
from trtspec.convert import params
from trtspec.errors import ConvertError

if TYPE_CHECKING:
    from trtspec.artifacts.hf import ModelConfig
    from trtspec.convert.checkpoint import ConvertJob, Tensors

MEDUSA, EAGLE = "medusa", "eagle"  # job kinds
Ranks = Callable[[int, int], "Tensors"]  # (tp rank, pp rank) -> that rank's head tensors


@dataclasses.dataclass(frozen=True)
class HeadLayout:
    weights: str  # the heads' weights file the converter reads (trtspec/artifacts/heads.py)
    write: Callable[[ConvertJob, ModelConfig, Tensors, Any], tuple[dict[str, Any], Ranks]]  # -> (config, ranks)


def _medusa(job: ConvertJob, shape: ModelConfig, target: Tensors, dtype: Any) -> tuple[dict[str, Any], Ranks]:
    from trtspec.convert import llama_tensors  # (torch)

    hcfg, heads = layouts.load_medusa(job.heads_dir, shape, ConvertError)
    nh, nl, mapping = hcfg.num_heads, hcfg.num_layers, job.mapping
    config = llama_tensors.medusa_config(shape, job.dtype, mapping, num_heads=nh, num_layers=nl,
                                 max_draft_len=job.max_draft_len)
    return config, lambda t, p: llama_tensors.medusa_rank_weights(heads, shape, mapping, t, p, nh, nl, dtype,
                                                          str(job.heads_dir))


def _eagle(job: ConvertJob, shape: ModelConfig, target: Tensors, dtype: Any) -> tuple[dict[str, Any], Ranks]:
    from trtspec.convert import llama_tensors  # (torch)

    if job.pp > 1:  # TensorRT-LLM's EagleForCausalLM asserts pp_size == 1
        raise ConvertError(f"gpu.pipeline_parallel = {job.pp}: EAGLE does not support pipeline parallelism",
                           hint="set pipeline_parallel = 1")
    if (why := params.draft_len_excess(job.max_draft_len)) is not None:
        raise ConvertError(f"EAGLE {why}", hint="use a smaller tree")
    eshape, eagle = layouts.load_eagle(job.heads_dir, shape, ConvertError)
    mapping = job.mapping
    config = llama_tensors.eagle_config(shape, eshape, job.dtype, mapping, max_draft_len=job.max_draft_len,
                                num_eagle_layers=job.num_eagle_layers,
                                max_non_leaves_per_layer=job.max_non_leaves_per_layer)
    return config, lambda t, p: llama_tensors.eagle_rank_weights(eagle, eshape, target, shape, mapping, t,
                                                         job.num_eagle_layers, dtype, str(job.heads_dir))


LAYOUTS = {MEDUSA: HeadLayout(layouts.MEDUSA_WEIGHTS, _medusa), EAGLE: HeadLayout(layouts.EAGLE_WEIGHTS, _eagle)}


def layout(kind: str) -> HeadLayout:
    try:
        return LAYOUTS[kind]
    except KeyError:
        raise ConvertError(f"unknown conversion kind {kind!r}") from None
