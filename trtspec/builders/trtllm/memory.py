"""GPU memory plan for the TensorRT-LLM runtimes: weights, KV bytes per token, and the
`kv_cache_free_gpu_mem_fraction` / `max_tokens_in_paged_kv_cache` of every Triton model.

Estimates from the HF configs (no weights are read):

* weights per GPU: the largest rank's share -- the embedding is replicated on every TP rank of
  the first pipeline stage (`use_parallel_embedding` is off), layers are split over TP, lm_head
  (padded to a multiple of TP) over TP on the last stage; Medusa heads / EAGLE nets join the
  target's last stage (EAGLE engines hold one copy of the drafter, embedding and lm_head per
  EAGLE layer).
* KV bytes per token per GPU: 2 (K and V) x layers in the stage x max(kv_heads / TP, 1) x
  head_dim x dtype bytes (EAGLE adds its drafter layers once per EAGLE layer).
* runtime: 1 GiB (CUDA context, TensorRT workspace) + activations for the default
  `max_num_tokens` (8192, or a full batch if smaller) + float32 logits of a full batch.

Two models on one GPU (draft-model): Triton loads them in either order and each executor takes
`kv_cache_free_gpu_mem_fraction` of the memory free *when it starts*. Both get the same token
budget T = u * F / (kv_target + kv_draft) (F: memory left after both models' weights and
runtime, u: runtime.trtllm.kv_cache_free_gpu_mem_fraction or 0.9), capped exactly with
`max_tokens_in_paged_kv_cache = T`; each fraction is what T needs in the worst order (loading
second): f_x = T kv_x / (F - T kv_other).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from trtspec.artifacts.hf import ModelConfig
from trtspec.builders.trtllm.method import EngineMethod
from trtspec.convert.mapping import pp_layers
from trtspec.errors import ConvertError, ModelError
from trtspec.spec import Spec

GiB = 1 << 30
MiB = 1 << 20
# Total memory as nvidia-smi reports it (H100 SXM 80 GB, H200 141 GB).
GPU_MEMORY = {"h100": 81559 * MiB, "h200": 143771 * MiB}
GPU_NAMES = {"h100": "H100 80GB", "h200": "H200 141GB", "cpu": "cpu"}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
DEFAULT_FRACTION = 0.9
RUNTIME_BASE = 1 * GiB
DEFAULT_MAX_NUM_TOKENS = 8192
INT32_MAX = (1 << 31) - 1  # the backend parses max_tokens_in_paged_kv_cache with std::stoi


@dataclasses.dataclass
class ModelMemory:
    role: str                       # "target" | "draft"
    triton_model: str               # "tensorrt_llm" | "tensorrt_llm_draft"
    params: int                     # whole model (all ranks)
    weights_bytes: int              # per GPU (largest rank)
    kv_bytes_per_token: int         # per GPU
    runtime_bytes: int              # per GPU (estimate)
    devices: list[int]
    kv_cache_free_gpu_mem_fraction: float
    max_tokens_in_paged_kv_cache: int | None
    kv_tokens: int                  # tokens the KV cache holds (estimate)


@dataclasses.dataclass
class MemoryPlan:
    gpu_type: str
    gpu_memory_bytes: int | None
    shared_gpu: bool                # target and draft share their GPUs
    needed_tokens: int              # a full batch: max_batch_size x (max_seq_len + max_draft_len)
    models: list[ModelMemory]
    problems: list[str]
    notes: list[str]

    def model(self, role: str) -> ModelMemory:
        return next(m for m in self.models if m.role == role)

    def fraction(self, role: str) -> float:
        return self.model(role).kv_cache_free_gpu_mem_fraction

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def rows(self) -> list[dict[str, str]]:
        def gb(n: int | None) -> str:
            if n is None:
                return "-"
            return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"
        return [{"model": m.triton_model, "role": m.role, "params": f"{m.params / 1e6:.1f}M",
                 "weights/GPU": gb(m.weights_bytes), "KV/token/GPU": f"{m.kv_bytes_per_token / 1024:.1f} KiB",
                 "runtime/GPU": gb(m.runtime_bytes), "GPUs": ",".join(map(str, m.devices)),
                 "kv_cache_free_gpu_mem_fraction": f"{m.kv_cache_free_gpu_mem_fraction:.3f}",
                 "max_tokens_in_paged_kv_cache": str(m.max_tokens_in_paged_kv_cache or "-"),
                 "KV tokens": str(m.kv_tokens)} for m in self.models]

    def table(self):
        """A rich Table (print it with rich's Console)."""
        from rich.table import Table

        mem = "-" if self.gpu_memory_bytes is None else f"{self.gpu_memory_bytes / GiB:.1f} GiB"
        t = Table(title=f"memory plan: {GPU_NAMES.get(self.gpu_type, self.gpu_type)} ({mem} per GPU)"
                        + (", target and draft share GPUs" if self.shared_gpu else ""))
        rows = self.rows()
        for col in (rows[0] if rows else {}):
            t.add_column(col, justify="left" if col in ("model", "role", "GPUs") else "right")
        for r in rows:
            t.add_row(*r.values())
        return t

    def lines(self) -> list[str]:
        """Plain-text form of the table, problems and notes."""
        rows = self.rows()
        if not rows:
            return self.problems + self.notes
        cols = list(rows[0])
        width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
        out = ["  ".join(c.ljust(width[c]) for c in cols)]
        out += ["  ".join(r[c].ljust(width[c]) for c in cols) for r in rows]
        out += [f"problem: {p}" for p in self.problems] + [f"note: {n}" for n in self.notes]
        return out


# ------------------------------------------------------------------------------ model sizes


def layer_params(cfg: ModelConfig) -> tuple[int, int]:
    """(params of one decoder layer, of which split over TP): its matmuls and two norms."""
    return cfg.layer_params + 2 * cfg.hidden_size, cfg.layer_params


def per_rank_layer(cfg: ModelConfig, tp: int) -> float:
    total, split = layer_params(cfg)
    H, nkv, hd = cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim
    dup = max(tp // nkv, 1) if nkv < tp else 1  # duplicated KV heads
    kv_extra = (dup - 1) * 2 * H * nkv * hd / tp if nkv < tp else 0
    return (total - split) + split / tp + kv_extra


def kv_per_token(cfg: ModelConfig, layers: int, tp: int, nbytes: int) -> int:
    return 2 * layers * max(cfg.num_kv_heads // tp, 1) * cfg.head_dim * nbytes


@dataclasses.dataclass(frozen=True)
class HeadSizes:
    """What a method's heads add to the target engine (its row's `memory_extras`)."""

    params: int           # whole heads
    last_stage: float     # params per rank on the target's last pipeline stage
    kv: int               # KV bytes per token per GPU


@dataclasses.dataclass
class _Sizes:
    params: int
    weights: int          # bytes, largest rank
    kv: int               # bytes per token per GPU (largest stage)
    hidden: int
    inter: int
    vocab: int


def _model_sizes(spec: Spec, method: EngineMethod, role: str, tp: int, pp: int) -> _Sizes:
    nbytes = DTYPE_BYTES[spec.trtllm_dtype]
    model_dir = Path(spec.model.target if role == "target" else spec.speculative.draft)
    cfg = ModelConfig.from_dir(model_dir)
    H, V, L = cfg.hidden_size, cfg.vocab_size, cfg.num_layers
    layer_total, _ = layer_params(cfg)
    vpad = -(-V // tp) * tp
    total = V * H + L * layer_total + H + (0 if cfg.tie_word_embeddings else V * H)
    extra_last, extra_kv = 0.0, 0
    if role == "target" and (heads := method.memory_extras(spec, cfg, tp, nbytes)) is not None:
        total += heads.params
        extra_last, extra_kv = heads.last_stage, heads.kv
    per_layer = per_rank_layer(cfg, tp)
    stage_bytes, stage_kv = [], []
    for p in range(pp):
        n_layers = len(pp_layers(L, pp, p))
        w = n_layers * per_layer
        kv = kv_per_token(cfg, n_layers, tp, nbytes)
        if p == 0:
            w += V * H
        if p == pp - 1:
            w += H + vpad * H / tp + extra_last
            kv += extra_kv
        stage_bytes.append(w * nbytes)
        stage_kv.append(kv)
    return _Sizes(int(total), int(max(stage_bytes)), int(max(stage_kv)), H, cfg.intermediate_size, V)


def _runtime_bytes(spec: Spec, s: _Sizes, tp: int, draft_len: int) -> int:
    lim = spec.limits
    nbytes = DTYPE_BYTES[spec.trtllm_dtype]
    tokens = min(DEFAULT_MAX_NUM_TOKENS, lim.max_batch_size * lim.max_seq_len)
    tokens = max(tokens, lim.max_batch_size * (draft_len + 1))
    activations = tokens * (8 * s.hidden + 3 * s.inter // tp) * nbytes
    logits = lim.max_batch_size * (draft_len + 1) * (-(-s.vocab // tp) * tp) * 4
    return int(RUNTIME_BASE + activations + logits)


# ------------------------------------------------------------------------------ the plan


def memory_plan(spec: Spec, method: EngineMethod, *, gpu_memory_bytes: int | None = None) -> MemoryPlan:
    """The memory plan for a trtllm runtime spec and its method's engines (the trtllm-engine runtime's row,
    trtspec/backends/trtllm_engine_methods.py, which both TensorRT-LLM runtimes size with); reads only
    config.json files.

    Problems (model does not fit, KV cache smaller than a full batch, unreadable configs) are
    listed in `.problems`, never raised, so `trtspec check` can print them with the rest.
    """
    from trtspec.builders.trtllm.plan import tp_pp

    mem = gpu_memory_bytes if gpu_memory_bytes is not None else GPU_MEMORY.get(spec.gpu.type)
    problems: list[str] = []
    notes: list[str] = []
    u = spec.runtime.trtllm.kv_cache_free_gpu_mem_fraction or DEFAULT_FRACTION
    try:
        draft_len = method.max_draft_len(spec)
    except (ConvertError, ModelError):  # an unreadable heads config: sizing the target names the problem
        draft_len = spec.speculative.num_draft_tokens
    needed = spec.limits.max_batch_size * (spec.limits.max_seq_len + draft_len)
    sizes: dict[str, _Sizes] = {}
    roles = method.engine_roles(spec)
    for role in roles:
        tp, pp = tp_pp(spec, role)
        try:
            sizes[role] = _model_sizes(spec, method, role, tp, pp)
        except ModelError as exc:
            problems.append(f"{role}: cannot size the model: {getattr(exc, 'message', exc)!s}")
    ws = spec.world_size
    target_devices = list(range(ws))
    shared = False
    devices = {"target": target_devices}
    if "draft" in roles:
        tp = spec.gpu.tensor_parallel
        if spec.gpu.count >= ws + tp:
            devices["draft"] = list(range(ws, ws + tp))
        else:
            devices["draft"] = list(range(tp))
            shared = True
    models: list[ModelMemory] = []
    run = {r: _runtime_bytes(spec, s, tp_pp(spec, r)[0], draft_len if r == "target" else 0)
           for r, s in sizes.items()}
    names = {"target": "tensorrt_llm", "draft": "tensorrt_llm_draft"}
    if mem is None:
        notes.append(f"gpu.type = {spec.gpu.type!r} has no known memory size; fractions use the default {u}")
    if shared and len(sizes) == 2 and mem is not None:
        t, d = sizes["target"], sizes["draft"]
        free = mem - t.weights - d.weights - run["target"] - run["draft"]
        if free <= 0:
            problems.append(f"target + draft weights and runtime ({(mem - free) / GiB:.1f} GiB) exceed the "
                            f"{mem / GiB:.1f} GiB of one {GPU_NAMES[spec.gpu.type]}")
            tokens, ft, fd = 0, u / 2, u / 2
        else:
            tokens = min(int(u * free // (t.kv + d.kv)), INT32_MAX)
            ft = _ceil3(tokens * t.kv / max(free - tokens * d.kv, 1))
            fd = _ceil3(tokens * d.kv / max(free - tokens * t.kv, 1))
        notes.append("target and draft share GPUs: both KV caches hold the same token budget, capped with "
                     "max_tokens_in_paged_kv_cache; each fraction is sized for loading second")
        for role, f in (("target", ft), ("draft", fd)):
            s = sizes[role]
            models.append(ModelMemory(role, names[role], s.params, s.weights, s.kv, run[role], devices[role],
                                      min(f, 0.99), tokens or None, tokens))
    else:
        for role, s in sizes.items():
            tokens = 0
            if mem is not None:
                free = mem - s.weights - run[role]
                if free <= 0:
                    problems.append(f"{role}: weights and runtime ({(s.weights + run[role]) / GiB:.1f} GiB per GPU) "
                                    f"exceed the {mem / GiB:.1f} GiB of one {GPU_NAMES[spec.gpu.type]}")
                else:
                    tokens = min(int(u * free // max(s.kv, 1)), INT32_MAX)
            models.append(ModelMemory(role, names[role], s.params, s.weights, s.kv, run[role], devices[role], u,
                                      None, tokens))
    for m in models:
        if mem is not None and 0 < m.kv_tokens < needed:
            problems.append(f"{m.triton_model}: the KV cache holds ~{m.kv_tokens} tokens, a full batch needs "
                            f"{needed} (max_batch_size x (max_seq_len + max_draft_len)); lower limits.max_batch_size "
                            "or use more GPUs")
    return MemoryPlan(spec.gpu.type, mem, shared, needed, models, problems, notes)


def _ceil3(x: float) -> float:
    return math.ceil(x * 1000) / 1000
