"""Models loaded once per process, and what loading one will hold (checked against the memory budget first).

`load_model` is how the engine loads its target and the draft-model proposer its drafter: a second engine over
the same checkpoint in this process (a bench of several specs over one target) gets a *view* of the model
already loaded — its own RoPE table, length limit and EAGLE capture, the same weight tensors — instead of
a second copy. The table holds models weakly: once no engine uses one, it is freed as before.

The key is everything that changes the loaded model: the checkpoint (its resolved path and the size, mtime and
inode of each of its files, weights, config and generation config alike, so a rewritten one loads anew), the
dtype, the device, the matmul weights' dtype, the quantization, and row-exactness (Llama.make_row_exact
changes which kernel multiplies one row).

`model_bytes` sizes a load from the safetensors headers alone (no tensor is read), as runtime/llama.py lays the
weights out (see its docstring): linears in their matmul dtype (int8 when quantized), prepacked for oneDNN
with the plain weight released, embeddings in their stored 16-bit dtype on CPU, plus the transient buffers of
the largest tensor being read and cast. `load_model` refuses (MemoryBudgetError) a load that would not fit.
"""

from __future__ import annotations

import copy
import threading
import weakref
from pathlib import Path

import torch

from trtspec.artifacts.hf import ModelConfig
from trtspec.artifacts.weights import _ST_DTYPES, safetensors_header, weight_files
from trtspec.runtime import memory
from trtspec.runtime.dtypes import compute_dtype, storage_dtype, target_weight_dtype
from trtspec.runtime.llama import Llama

QUANTIZED_BYTES = {"int8": 1, "w8a8": 1, "w4a8": 0.5 + 1 / 32}  # per matmul weight (w4a8: a nibble + a group's step)
_LOADED: "weakref.WeakValueDictionary[tuple, Llama]" = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def model_bytes(path: str | Path, *, dtype: str = "float32", device: str = "cpu",
                weight_dtype: torch.dtype | None = None, quantization: str | None = None) -> int:
    """Bytes a Llama.from_dir of `path` holds once loaded, plus its load's transient peak (module docstring)."""
    compute = compute_dtype(dtype, device)
    mm = weight_dtype or target_weight_dtype(dtype, device) or compute
    mm_size = QUANTIZED_BYTES.get(quantization or "", mm.itemsize)
    total, transient = 0, 0
    for f in weight_files(Path(path)):
        for name, info in safetensors_header(f).items():
            shape = [int(d) for d in info.get("shape", [])]
            n = 1
            for d in shape:
                n *= d
            stored = getattr(torch, _ST_DTYPES.get(info.get("dtype"), "float32"))
            cast = 0 if mm == stored else n * stored.itemsize  # the tensor as read, beside its cast copy
            if name.endswith(("embed_tokens.weight", "lm_head.weight")):
                keep = storage_dtype(stored, compute)
                total += n * keep.itemsize
                transient = max(transient, 0 if keep == stored else n * stored.itemsize)
            elif len(shape) == 2:
                total += int(n * mm_size)
                # while packed or quantized, the plain weight is alive too; gate+up are concatenated first
                transient = max(transient, 2 * (n * mm.itemsize + cast))
            else:
                total += n * compute.itemsize
    c = ModelConfig.from_dir(path)
    head = c.vocab_size * c.hidden_size
    total += int(head * mm_size)  # the head's own matmul copy (prepacked or quantized), made while its source lives
    return total + max(transient, head * mm.itemsize)


def _key(path: Path, *parts) -> tuple:
    files = sorted({*(f for f in path.iterdir() if f.is_file()), *weight_files(path)})
    stats = tuple((f.name, st.st_size, st.st_mtime_ns, st.st_ino) for f in files for st in [f.stat()])
    return (str(path.resolve()), stats, *parts)


def load_model(path: str | Path, *, dtype: str = "float32", device: str = "cpu", max_seq: int = 4096,
               name: str | None = None, weight_dtype: torch.dtype | None = None, quantization: str | None = None,
               row_exact: bool = False) -> Llama:
    """Llama.from_dir(...) (made row-exact with `row_exact`), or a view of the one this process already holds
    (module docstring). Raises MemoryBudgetError before reading any tensor when a new load would not fit."""
    path = Path(path)
    key = _key(path, dtype, str(device), weight_dtype or target_weight_dtype(dtype, device), quantization,
               bool(row_exact))
    with _LOCK:
        base = _LOADED.get(key)
        if base is None:
            need = model_bytes(path, dtype=dtype, device=device, weight_dtype=weight_dtype, quantization=quantization)
            what = f"{name or path.name} ({path}, {dtype}{', ' + quantization if quantization else ''})"
            memory.require(need, what)
            base = Llama.from_dir(path, dtype=dtype, device=device, max_seq=max_seq, name=name,
                                  weight_dtype=weight_dtype, quantization=quantization)
            if row_exact:
                base.make_row_exact()
            _LOADED[key] = base
    return view(base, max_seq=max_seq, name=name or path.name)


def view(base: Llama, *, max_seq: int, name: str) -> Llama:
    """A Llama sharing `base`'s weights (layers, embeddings, head), with its own name, RoPE table and length
    limit; it keeps `base` (and so the table's entry) alive."""
    m = copy.copy(base)
    m._base = base  # type: ignore[attr-defined]
    m.name = name
    m.set_max_seq(max_seq)
    return m


def cache_bytes(model: Llama, batch: int, max_seq: int) -> int:
    """Bytes of `model.new_cache(batch, max_seq)`: K and V, [layers, batch, kv_heads, max_seq, head_dim]."""
    c = model.cfg
    return 2 * c.num_layers * batch * c.num_kv_heads * max_seq * c.head_dim * model.dtype.itemsize


def new_cache(model: Llama, batch: int, max_seq: int):
    """model.new_cache(batch, max_seq), refused (MemoryBudgetError) before allocating when it would not fit."""
    memory.require(cache_bytes(model, batch, max_seq),
                   f"{model.name}'s KV cache ({batch} rows x {max_seq} slots, {model.cfg.num_layers} layers)",
                   hint="lower limits.max_batch_size, max_input_len or max_output_len, or free memory; "
                        f"{memory.ENV} overrides the measured number")
    return model.new_cache(batch, max_seq)
