"""Tensor- and pipeline-parallel sharding as TensorRT-LLM lays a checkpoint out, and its inverse.

Rank numbering follows `tensorrt_llm.Mapping`: rank = pp_rank * tp_size + tp_rank.
Pipeline stage `p` owns the layers `torch.tensor_split(arange(L), pp)[p]` (the first
`L % pp` stages get one extra layer), named with their LOCAL index inside the stage.
"""

from __future__ import annotations

import torch

from trtspec.convert.mapping import Mapping, pp_layers
from trtspec.errors import ConvertError

__all__ = ["Mapping", "pp_layers"]


def split(t: torch.Tensor, tp: int, rank: int, dim: int = 0) -> torch.Tensor:
    if t.shape[dim] % tp:
        raise ConvertError(f"cannot split a dimension of {t.shape[dim]} into {tp} equal tensor-parallel shards",
                           hint="choose a tensor_parallel size that divides the model's dimensions")
    return torch.chunk(t, tp, dim=dim)[rank].clone().contiguous()


def merge(parts: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    return torch.cat(parts, dim=dim).contiguous()


def pad_vocab(vocab: int, tp: int) -> int:
    return -(-vocab // tp) * tp


def split_vocab(t: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rows padded with zeros to a multiple of tp, then split on dim 0 (the lm_head rule)."""
    rows = pad_vocab(t.shape[0], tp)
    if rows != t.shape[0]:
        t = torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))], dim=0)
    return split(t, tp, rank, 0)


def merge_vocab(parts: list[torch.Tensor], vocab: int) -> torch.Tensor:
    return merge(parts, 0)[:vocab].contiguous()


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    if num_kv_heads >= tp:
        if num_kv_heads % tp:
            raise ConvertError(f"{num_kv_heads} key/value heads cannot be split over tensor_parallel={tp}",
                               hint="choose a tensor_parallel size that divides num_key_value_heads")
        return num_kv_heads // tp
    if tp % num_kv_heads:
        raise ConvertError(f"tensor_parallel={tp} is not a multiple of the {num_kv_heads} key/value heads",
                           hint="with fewer KV heads than ranks, tensor_parallel must be a multiple of them")
    return 1


def split_kv(t: torch.Tensor, num_kv_heads: int, tp: int, rank: int) -> torch.Tensor:
    """k or v projection (weight [nkv*hd, H] or bias [nkv*hd]) for one TP rank.

    With fewer KV heads than ranks each head is duplicated tp/nkv times first
    (TensorRT-LLM `dup_kv_weight`), so rank r holds head r // (tp/nkv).
    """
    if num_kv_heads >= tp:
        kv_heads_per_rank(num_kv_heads, tp)
        return split(t, tp, rank, 0)
    kv_heads_per_rank(num_kv_heads, tp)
    reps = tp // num_kv_heads
    head = t.shape[0] // num_kv_heads
    h = rank // reps
    return t[h * head:(h + 1) * head].clone().contiguous()


def merge_kv(parts: list[torch.Tensor], num_kv_heads: int, tp: int) -> torch.Tensor:
    """Inverse of split_kv over all TP ranks; duplicated heads must agree bit for bit."""
    if num_kv_heads >= tp:
        return merge(parts, 0)
    reps = tp // num_kv_heads
    heads = []
    for h in range(num_kv_heads):
        group = parts[h * reps:(h + 1) * reps]
        for other in group[1:]:
            if not torch.equal(group[0], other):
                raise ConvertError("duplicated key/value heads differ between tensor-parallel ranks",
                                   hint="the checkpoint was not written by a consistent converter")
        heads.append(group[0])
    return merge(heads, 0)


def same_on_all(parts: list[torch.Tensor], name: str) -> torch.Tensor:
    """A replicated tensor: every rank holds the same copy; returns it (and checks)."""
    for other in parts[1:]:
        if other.shape != parts[0].shape or not torch.equal(parts[0], other):
            raise ConvertError(f"replicated weight {name!r} differs between ranks",
                               hint="the checkpoint was not written by a consistent converter")
    return parts[0]
