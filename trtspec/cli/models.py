"""`trtspec models ...`: the shipped demo model family (see trtspec.models.demo)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click


def register(main: click.Group) -> None:
    main.add_command(models)


@click.group("models")
def models() -> None:
    """Demo model family: a stdlib-trained Llama target with draft, Medusa and EAGLE drafters."""


def _progress_reporter(console):
    """A Reporter drawing one rich progress bar per phase (plain log lines when not a terminal)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    progress = Progress(
        TextColumn("[bold]{task.fields[phase]:<8}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn(), console=console,
    )
    tasks: dict[str, int] = {}

    def report(phase: str, step: int, total: int, loss: float | None) -> None:
        text = f"loss {loss:.3f}" if loss is not None else ""
        if phase not in tasks:
            tasks[phase] = progress.add_task(phase, total=total, phase=phase, loss="")
        progress.update(tasks[phase], completed=step, loss=text)
        if not console.is_terminal and (step == total or step % max(1, total // 20) == 0):
            console.log(f"{phase} {step}/{total} {text}")

    return progress, report


@models.command("train-demo")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("examples/models"),
              show_default=True, envvar="TRTSPEC_DEMO_OUT", help="Directory to write the family to (replaced atomically).")
@click.option("--seed", type=int, default=0, show_default=True, envvar="TRTSPEC_DEMO_SEED",
              help="Seed for data order, initialisation and the corpus snippets used for measurement.")
@click.option("--quick", is_flag=True, envvar="TRTSPEC_DEMO_QUICK",
              help="Tiny models, corpus subset and a few steps: a few-second smoke run for tests.")
@click.option("--target-steps", type=int, default=None, envvar="TRTSPEC_DEMO_TARGET_STEPS",
              help="Optimizer steps for the target (default 1050; --quick 6).")
@click.option("--target-batch", type=int, default=None, envvar="TRTSPEC_DEMO_TARGET_BATCH",
              help="Sequences per target step (default 16).")
@click.option("--draft-steps", type=int, default=None, envvar="TRTSPEC_DEMO_DRAFT_STEPS",
              help="Optimizer steps for the distilled draft model (default 2000).")
@click.option("--medusa-steps", type=int, default=None, envvar="TRTSPEC_DEMO_MEDUSA_STEPS",
              help="Optimizer steps for the Medusa heads (default 500).")
@click.option("--eagle-steps", type=int, default=None, envvar="TRTSPEC_DEMO_EAGLE_STEPS",
              help="Optimizer steps for the EAGLE head (default 1000).")
@click.option("--teacher-seqs", type=int, default=None, envvar="TRTSPEC_DEMO_TEACHER_SEQS",
              help="Training sequences in the one frozen-target pass (features + top-k logits) the "
                   "drafters learn from (default 4096).")
@click.option("--threads", type=int, default=2, show_default=True, envvar="TRTSPEC_DEMO_THREADS",
              help="torch intra-op threads.")
@click.option("--force", is_flag=True, envvar="TRTSPEC_DEMO_FORCE", help="Replace a non-empty --out directory.")
def train_demo(out: Path, seed: int, quick: bool, target_steps: int | None, target_batch: int | None,
               draft_steps: int | None, medusa_steps: int | None, eagle_steps: int | None,
               teacher_seqs: int | None, threads: int, force: bool) -> None:
    """Train the demo family (tokenizer, target, draft, Medusa, EAGLE) and write it with a MANIFEST.

    Reproducible: fixed seed and fixed step counts (no time budget). The default run takes about
    40-50 minutes on 2 CPU cores and writes ~58 MB of float16 weights.
    """
    from rich.console import Console

    from trtspec.errors import ModelError
    from trtspec.models import demo

    cfg = demo.FamilyConfig.quick_config(seed) if quick else replace(demo.FamilyConfig(), seed=seed)
    for name, value in (("target_steps", target_steps), ("target_batch", target_batch),
                        ("draft_steps", draft_steps), ("medusa_steps", medusa_steps),
                        ("eagle_steps", eagle_steps), ("teacher_seqs", teacher_seqs), ("threads", threads)):
        if value is not None and value < 1:
            raise ModelError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    stages = {"target_stage": replace(cfg.target_stage, steps=target_steps or cfg.target_stage.steps,
                                      batch=target_batch or cfg.target_stage.batch),
              "draft_stage": replace(cfg.draft_stage, steps=draft_steps or cfg.draft_stage.steps),
              "medusa_stage": replace(cfg.medusa_stage, steps=medusa_steps or cfg.medusa_stage.steps),
              "eagle_stage": replace(cfg.eagle_stage, steps=eagle_steps or cfg.eagle_stage.steps)}
    for key, stage in stages.items():
        stages[key] = replace(stage, warmup=min(stage.warmup, max(1, stage.steps // 5)))
    cfg = replace(cfg, **stages, teacher_seqs=teacher_seqs or cfg.teacher_seqs, threads=threads)

    console = Console(stderr=True)
    progress, report = _progress_reporter(console)
    with progress:
        manifest = demo.train_family(out, cfg, report=report, force=force, log=console.log)
    summary = {name: {k: m[k] for k in ("params", "loss", "alpha_teacher_forced", "head_top1", "acceptance")
                      if k in m} for name, m in manifest["models"].items()}
    console.print_json(json.dumps(summary))
    click.echo(f"wrote {out} in {manifest['wall_s_total']:.0f}s")
