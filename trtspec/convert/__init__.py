"""`trtspec convert`: native HF -> TensorRT-LLM checkpoint writer (pure torch + safetensors, CPU).

    result = convert(jobs, out_dir, force=False)

writes each job's checkpoint, one per role the spec's method needs, into `<out_dir>/<role>/` (by default
`<engines>/<name>/checkpoints/<role>/`). The jobs are the trtllm-engine runtime's for the spec (its method
table's `conversions`, trtspec/backends/trtllm_engine_methods.py), which name the head layout of each
(trtspec/convert/trtllm_heads.py):

    method        target checkpoint                     draft checkpoint
    draft-model   LlamaForCausalLM                       LlamaForCausalLM (same TP, PP 1)
    medusa        MedusaForCausalLM (base + heads)       -
    eagle         EagleForCausalLM (base + EAGLE-1 head) -
    lookahead     LlamaForCausalLM                       -
    none          LlamaForCausalLM                       -

`read_checkpoint(dir)` reassembles the HF state dicts from any sharding (the proof of the
writer: round trips are bit-identical). Unsupported architectures raise ConvertError listing
the supported ones (`SUPPORTED_ARCHITECTURES`).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from trtspec.convert.checkpoint import (MANIFEST, ConvertedCheckpoint, ConvertJob, Reassembled,
                                        hf_config_from_trtllm, is_fresh, read_checkpoint, read_manifest, run_job)
from trtspec.convert.hf import SUPPORTED_ARCHITECTURES, TRTLLM_ARCHITECTURES
from trtspec.spec import Spec

DEFAULT_ENGINES = Path("engines")


@dataclasses.dataclass
class ConvertResult:
    out_dir: str
    checkpoints: dict[str, ConvertedCheckpoint]
    seconds: float

    @property
    def converted(self) -> list[str]:
        return [r for r, c in self.checkpoints.items() if c.converted]

    def to_dict(self) -> dict[str, Any]:
        return {"out_dir": self.out_dir, "seconds": round(self.seconds, 3),
                "checkpoints": {r: c.to_dict() for r, c in self.checkpoints.items()},
                "converted": self.converted}


def default_out_dir(spec: Spec, engines: Path = DEFAULT_ENGINES) -> Path:
    return Path(engines) / spec.name / "checkpoints"


def convert(jobs: list[ConvertJob], out_dir: Path, *, force: bool = False,
            log: Callable[[str], None] | None = None) -> ConvertResult:
    """Write (or confirm up to date) every job's checkpoint (under `out_dir`). Atomic per checkpoint."""
    t0 = time.perf_counter()
    done = {job.role: run_job(job, force=force, log=log) for job in jobs}
    return ConvertResult(str(out_dir), done, time.perf_counter() - t0)


__all__ = ["ConvertJob", "ConvertResult", "ConvertedCheckpoint", "MANIFEST", "Reassembled", "SUPPORTED_ARCHITECTURES",
           "TRTLLM_ARCHITECTURES", "convert", "default_out_dir", "hf_config_from_trtllm", "is_fresh",
           "read_checkpoint", "read_manifest", "run_job"]
