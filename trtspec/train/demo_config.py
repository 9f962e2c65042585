"""The demo family's recipe (`FamilyConfig`): the target's shape and schedule, each drafter's budget in
`trtspec train` terms, the teacher pass and the measurement, all with a fixed seed and fixed step counts."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from trtspec.errors import ModelError
from trtspec.train.modules import Shape
from trtspec.train.recipe import TrainConfig


@dataclass(frozen=True)
class Stage:
    """The target's schedule (demo.py's own loop, `train_lm`)."""

    steps: int
    batch: int
    lr: float
    warmup: int = 50
    weight_decay: float = 0.1


@dataclass(frozen=True)
class DrafterRun:
    """One drafter's budget in `trtspec train` terms (TrainConfig.steps, .lr, .warmup: warmup then cosine to a
    tenth, warmup at most a tenth of the steps)."""

    steps: int
    lr: float
    warmup: int = 40


# family member -> the `trtspec train` kind that makes it
DRAFTERS = {"draft": "draft-model", "medusa": "medusa", "eagle": "eagle"}


@dataclass(frozen=True)
class FamilyConfig:
    seed: int = 0
    seq_len: int = 256           # target windows; the drafters' text samples (TrainConfig.text_tokens)
    target: Shape = Shape(n_layer=6, dim=512, n_head=8, n_kv_head=4, ffn=1408)
    target_stage: Stage = Stage(steps=1050, batch=16, lr=1.5e-3, warmup=60)
    draft_layers: int = 2        # the distilled draft: `trtspec train draft-model --layers --hidden`
    draft_hidden: int = 192
    draft_run: DrafterRun = DrafterRun(steps=2000, lr=3e-3)
    medusa_run: DrafterRun = DrafterRun(steps=500, lr=1e-3)
    eagle_run: DrafterRun = DrafterRun(steps=1000, lr=1e-3)
    drafter_batch: int = 16      # samples per drafter step (TrainConfig.batch_tokens = drafter_batch * seq_len)
    teacher_seqs: int = 2048     # text samples of seq_len tokens in the drafters' frozen-target pass
    topk: int = 32               # the teacher's top-k logits every drafter learns from
    eval_seqs: int = 48          # seq_len windows for train / held-out loss
    accept_prompts: int = 16
    accept_prompt_tokens: int = 64
    accept_new_tokens: int = 64
    max_files: int | None = None
    max_file_bytes: int | None = None
    threads: int = 2
    quick: bool = False

    @classmethod
    def quick_config(cls, seed: int = 0) -> FamilyConfig:
        """A few-second run for tests: tiny models, a corpus subset, a handful of steps."""
        return cls(
            seed=seed, seq_len=64,
            target=Shape(n_layer=2, dim=64, n_head=4, n_kv_head=2, ffn=128, max_pos=256),
            target_stage=Stage(steps=6, batch=8, lr=3e-3, warmup=2),
            draft_layers=1, draft_hidden=32, draft_run=DrafterRun(steps=4, lr=3e-3, warmup=1),
            medusa_run=DrafterRun(steps=3, lr=1e-3, warmup=1), eagle_run=DrafterRun(steps=3, lr=1e-3, warmup=1),
            drafter_batch=8, teacher_seqs=16, topk=8, eval_seqs=4, accept_prompts=2, accept_prompt_tokens=16,
            accept_new_tokens=8, max_files=50, max_file_bytes=12_000, quick=True,
        )

    def with_counts(self, *, threads: int | None = None, target_steps: int | None = None,
                    target_batch: int | None = None, draft_steps: int | None = None, medusa_steps: int | None = None,
                    eagle_steps: int | None = None, teacher_seqs: int | None = None) -> FamilyConfig:
        """This recipe with other step counts / sizes (None: keep); the target's warmup shrinks to at most a
        fifth of its steps (the drafter trainer caps its own at a tenth)."""
        given = {"target_steps": target_steps, "target_batch": target_batch, "draft_steps": draft_steps,
                 "medusa_steps": medusa_steps, "eagle_steps": eagle_steps, "teacher_seqs": teacher_seqs,
                 "threads": threads}
        for name, value in given.items():
            if value is not None and value < 1:
                raise ModelError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        st = replace(self.target_stage, steps=target_steps or self.target_stage.steps,
                     batch=target_batch or self.target_stage.batch)
        return replace(self, target_stage=replace(st, warmup=min(st.warmup, max(1, st.steps // 5))),
                       draft_run=replace(self.draft_run, steps=draft_steps or self.draft_run.steps),
                       medusa_run=replace(self.medusa_run, steps=medusa_steps or self.medusa_run.steps),
                       eagle_run=replace(self.eagle_run, steps=eagle_steps or self.eagle_run.steps),
                       teacher_seqs=teacher_seqs or self.teacher_seqs, threads=threads or self.threads)

    def drafter_config(self, member: str, text: Path, vocab: int) -> TrainConfig:
        """The `trtspec train` config of family member `member` ("draft", "medusa", "eagle") on the plain-text
        file `text`: the whole vocabulary as the draft vocabulary (the demo's is small: no position is left
        out, and Medusa's lm_head rows are all trained), no held-out measurement of its own (the family's
        below), this family's seed."""
        run = {"draft": self.draft_run, "medusa": self.medusa_run, "eagle": self.eagle_run}[member]
        return TrainConfig(data=str(text), samples=self.teacher_seqs, text_tokens=self.seq_len, draft_vocab=vocab,
                           topk=self.topk, steps=run.steps, lr=run.lr, warmup=run.warmup,
                           batch_tokens=self.drafter_batch * self.seq_len, seed=self.seed, device="cpu",
                           eval_prompts=0, medusa_heads=4, noise=0.1, draft_layers=self.draft_layers,
                           draft_hidden=self.draft_hidden)
