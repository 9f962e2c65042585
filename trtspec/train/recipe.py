"""A drafter run's recipe and budget (`TrainConfig`), and the progress callback every stage reports to."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from trtspec.artifacts.fs import digest

# A step callback: (phase, step, total_steps, loss or None). The CLI turns it into progress bars.
Reporter = Callable[[str, int, int, "float | None"], None]


def silent(phase: str, step: int, total: int, loss: float | None) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    data: str = "builtin:mix"
    samples: int = 512           # training samples (prompts answered, or text chunks)
    max_new_tokens: int = 192
    temperature: float = 0.8
    top_p: float = 0.95
    gen_batch: int = 16
    text_tokens: int = 256       # plain text: tokens per chunk
    draft_vocab: int = 8192
    topk: int = 32
    steps: int | None = None
    minutes: float | None = None
    ttt_steps: int = 4
    lr: float = 6e-4
    warmup: int = 40
    batch_tokens: int = 4096
    seed: int = 0
    device: str = "cpu"
    eval_prompts: int = 12
    eval_new_tokens: int = 64
    eval_k: int = 4
    intermediate_size: int | None = None  # the head's MLP (default: the target's)
    checkpoint_s: float = 120.0
    medusa_heads: int = 4
    noise: float = 0.1           # EAGLE-1: uniform noise on the input features
    draft_layers: int = 2        # draft-model: decoder layers
    draft_hidden: int | None = None  # draft-model: width (default: the target's; heads scaled alike)

    def recipe(self, kind: str) -> dict[str, Any]:
        """The fields a `kind` run's weights depend on (the checkpoint key): not the budget, the device or
        the measurement, nor another kind's options (so an older eagle3 checkpoint still resumes)."""
        run = ("steps", "minutes", "device", "checkpoint_s", "eval_prompts", "eval_new_tokens")
        own = {"eagle3": ("ttt_steps", "intermediate_size"), "eagle": ("noise", "intermediate_size"),
               "medusa": ("medusa_heads",), "draft-model": ("draft_layers", "draft_hidden")}
        other = {f for k, fs in own.items() if k != kind for f in fs} - set(own[kind])
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in run and k not in other}

    def data_key(self, target: dict[str, Any]) -> str:
        return digest({"target": target, **{k: getattr(self, k) for k in (
            "data", "max_new_tokens", "temperature", "top_p", "text_tokens", "seed")}})
