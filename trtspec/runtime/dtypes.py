"""The dtypes the torch runtime computes and stores in: the compute dtype (float32 on CPU), the matmul weights'
dtype of targets and drafters (bfloat16 where the CPU multiplies it natively), and that CPU check."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def compute_dtype(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype:
    """The dtype the target computes in: the serving dtype on CUDA, float32 on CPU."""
    dt = _DTYPES[dtype] if isinstance(dtype, str) else dtype
    return dt if torch.device(device).type == "cuda" else torch.float32


def storage_dtype(stored: torch.dtype, compute: torch.dtype) -> torch.dtype:
    """The dtype a looked-up table (the embedding, an untied LM head's source) is kept in: its stored 16-bit
    float dtype when the model computes in float32 (bf16 and fp16 widen to fp32 exactly, so rows cast at
    lookup are the same numbers, at half the memory), else the compute dtype."""
    if compute == torch.float32 and stored in (torch.bfloat16, torch.float16):
        return stored
    return compute


BF16_MIN_BYTES = 8 << 20  # drafter matmul weights (in fp32) below this stay fp32: casts would cost more


def draft_dtype(dtype: str | torch.dtype, device: str | torch.device, nbytes: int | None = None) -> torch.dtype:
    """The dtype of drafters' matmul weights. Drafts only propose; the target's verification keeps the output
    exact (greedy identity; sampling uses the very q a draft was sampled from), so on CPUs with native bf16
    (avx512_bf16/AMX) drafter weights are bfloat16 — half the memory traffic of their matmuls, while
    activations, norms, attention and the KV cache stay float32 (bf16 attention is slow on CPU). Small
    drafters (`nbytes` of fp32 weights < BF16_MIN_BYTES: cache-resident, cast-bound) stay float32, as do CPUs
    without native bf16. `TRTSPEC_DRAFT_DTYPE=float32|bfloat16` forces a choice."""
    forced = os.environ.get("TRTSPEC_DRAFT_DTYPE")
    if forced:
        return _DTYPES[forced]
    big = nbytes is None or nbytes >= BF16_MIN_BYTES
    if torch.device(device).type == "cpu" and big and cpu_has_fast_bf16():
        return torch.bfloat16
    return compute_dtype(dtype, device)


def target_weight_dtype(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype | None:
    """The dtype of the target's matmul weights on CPU when the spec serves a 16-bit dtype: bfloat16 on CPUs
    that multiply it natively (avx512_bf16/AMX, through oneDNN in fixed row blocks, runtime/linear.py, so a
    verify row computes the bits of its decode step and spec and plain decoding stay token-identical), halving
    the memory traffic of a memory-bound decode; None (= the compute dtype, float32) otherwise. Measured on
    the project's CPUs without native bf16 (AVX2, 2 threads, SmolLM2-135M): a bf16 GEMV is slower than fp32 oneDNN; an
    fp16 GEMV is 1.7x faster for one row (LM head 2.8 vs 4.8 ms) but 2-5x slower for the 2..40-row passes (verify,
    prefill: no oneDNN fp16 there) and rounds differently from them, so fp32 serves there.
    `TRTSPEC_TARGET_DTYPE=float32|bfloat16` forces a choice."""
    forced = os.environ.get("TRTSPEC_TARGET_DTYPE")
    if forced:
        return _DTYPES[forced]
    want = _DTYPES[dtype] if isinstance(dtype, str) else dtype
    if torch.device(device).type == "cpu" and want != torch.float32 and cpu_has_fast_bf16():
        return torch.bfloat16
    return None


def cpu_flags() -> str:
    """This CPU's line of flags in /proc/cpuinfo ("" where there is none)."""
    try:
        return next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        return ""


@functools.lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    """The CPU multiplies bfloat16 natively (AVX-512 BF16 or AMX) and torch may use it: a process whose kernels
    are capped below AVX-512 (ATEN_CPU_CAPABILITY=avx2, the way to stand in for an AVX2-only machine) has no
    native bf16 either, and multiplies in float32 as such a machine does."""
    try:
        native = not {"avx512_bf16", "amx_bf16"}.isdisjoint(cpu_flags().split())
        return native and "AVX512" in torch.backends.cpu.get_cpu_capability() and \
            torch.ops.mkldnn._is_mkldnn_bf16_supported()
    except (RuntimeError, AttributeError):  # (cpu_flags reads the file without raising)
        return False
