"""Parallel layout of a TensorRT-LLM checkpoint (torch-free, so cache checks stay fast)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mapping:
    """`tensorrt_llm.Mapping` reduced to what a checkpoint records: rank = pp_rank * tp_size + tp_rank."""

    tp_size: int = 1
    pp_size: int = 1

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def ranks(self) -> list[tuple[int, int, int]]:
        """(rank, tp_rank, pp_rank) for every rank, in rank order."""
        return [(p * self.tp_size + t, t, p) for p in range(self.pp_size) for t in range(self.tp_size)]

    def to_config(self) -> dict[str, int]:
        return {"world_size": self.world_size, "tp_size": self.tp_size, "pp_size": self.pp_size}


def pp_layers(num_layers: int, pp_size: int, pp_rank: int) -> list[int]:
    """Global layer indices of pipeline stage `pp_rank`, as TensorRT-LLM's `Mapping.pp_layers`
    (`torch.tensor_split(arange(L), pp)[rank]`): the first `L % pp` stages get one extra layer."""
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return list(range(start, start + base + (1 if pp_rank < extra else 0)))
