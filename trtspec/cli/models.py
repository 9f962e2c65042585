"""`trtspec models ...`: the shipped demo model family (see trtspec.train.demo) and GGUF imports
(trtspec.artifacts.gguf)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click


def register(main: click.Group) -> None:
    main.add_command(models)


@click.group("models")
def models() -> None:
    """Model files: the stdlib-trained demo family (target + draft, Medusa and EAGLE drafters), and GGUF
    imports into Hugging Face checkpoints."""


@models.command("import")
@click.argument("src", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True,
              help="Checkpoint directory to write (appears complete or not at all).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32", show_default=True,
              help="dtype of the written weights (float32 keeps the GGUF's dequantized values exactly).")
@click.option("--force", is_flag=True, help="Replace --out when it holds something else than this import.")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def import_(src: Path, out: Path, dtype: str, force: bool, as_json: bool) -> None:
    """Import a llama.cpp GGUF file (SRC) as a Hugging Face checkpoint: model.safetensors, config.json,
    generation_config.json, tokenizer.json + tokenizer_config.json (with the chat template) and the
    manifest trtspec.import.json (source sha256, tensors, dtype, tool versions). Importing the same file
    with the same dtype again writes nothing.

    \b
    Example:
      trtspec models import SmolLM2-135M-Instruct.Q4_1.gguf --out examples/models/smollm2-135m-instruct
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trtspec.artifacts.gguf import import_gguf

    console = Console(stderr=True)
    progress = Progress(TextColumn("[bold]{task.description:<10}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, disable=as_json or not console.is_terminal)
    tasks: dict[str, int] = {}

    def report(phase: str, done: int, total: int) -> None:
        if phase not in tasks:
            tasks[phase] = progress.add_task(phase, total=total)
            if not console.is_terminal and not as_json:
                console.log(phase)
        progress.update(tasks[phase], completed=done, total=total)

    with progress:
        m = import_gguf(src, out, dtype, force=force, report=report)
    if as_json:
        click.echo(json.dumps({k: v for k, v in m.items() if k != "tensors"} | {"tensors": m["tensors"]["count"]},
                              indent=2))
    elif m.get("skipped"):
        click.echo(f"{out}: already imported from {src.name} ({dtype}); nothing written")
    else:
        t = m["tensors"]
        click.echo(f"wrote {out}: {t['count']} tensors, {t['parameters'] / 1e6:.1f}M parameters, {dtype}")


def _progress_reporter(console):
    """A Reporter drawing one rich progress bar per phase (plain log lines when not a terminal)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

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


# The step/size overrides of train-demo (each --NAME, envvar TRTSPEC_DEMO_NAME; see FamilyConfig.with_counts).
COUNTS = {
    "target_steps": "Optimizer steps for the target (default 1050; --quick 6).",
    "target_batch": "Sequences per target step (default 16).",
    "draft_steps": "`trtspec train draft-model` steps for the distilled draft (default 2000).",
    "medusa_steps": "`trtspec train medusa` steps for the Medusa heads (default 500).",
    "eagle_steps": "`trtspec train eagle` steps for the EAGLE-1 head (default 1000).",
    "teacher_seqs": "Text samples of 256 tokens (--quick: 64) from the corpus' training split in the one "
                    "frozen-target pass all three drafters learn from (`trtspec train --samples`; default 2048).",
}


def _count_options(command):
    for name, text in reversed(COUNTS.items()):
        command = click.option(f"--{name.replace('_', '-')}", name, type=int, default=None,
                               envvar=f"TRTSPEC_DEMO_{name.upper()}", help=text)(command)
    return command


@models.command("train-demo")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("examples/models"),
              show_default=True, envvar="TRTSPEC_DEMO_OUT",
              help="Directory to write the family to (replaced atomically).")
@click.option("--target", type=click.Path(file_okay=False, path_type=Path), default=None,
              envvar="TRTSPEC_DEMO_TARGET",
              help="Train only the drafters, against this existing family target (e.g. examples/models/target): "
                   "it is copied into --out byte for byte, its tokenizer kept (no --target-steps/--target-batch).")
@click.option("--seed", type=int, default=0, show_default=True, envvar="TRTSPEC_DEMO_SEED",
              help="Seed for data order, initialisation and the corpus snippets used for measurement.")
@click.option("--quick", is_flag=True, envvar="TRTSPEC_DEMO_QUICK",
              help="Tiny models, corpus subset and a few steps: a few-second smoke run for tests.")
@_count_options
@click.option("--threads", type=int, default=2, show_default=True, envvar="TRTSPEC_DEMO_THREADS",
              help="torch intra-op threads.")
@click.option("--force", is_flag=True, envvar="TRTSPEC_DEMO_FORCE", help="Replace a non-empty --out directory.")
def train_demo(out: Path, target: Path | None, seed: int, quick: bool, threads: int, force: bool,
               **counts: int | None) -> None:
    """Train the demo family and write it with a MANIFEST: the tokenizer and the target here, then the
    draft model, Medusa and EAGLE-1 drafters by `trtspec train` (draft-model, medusa, eagle) on the corpus'
    training text, then acceptance measured by the runtime on held-out snippets.

    Reproducible: fixed seed and fixed step counts (no time budget). On 2 CPU cores the target takes
    ~35 minutes and a drafter step ~0.8 s, so the default drafter budgets about an hour more (a --target
    run with --teacher-seqs 1024 and 800/300/600 steps took 29 minutes in all). ~58 MB of float16
    weights. With --target only the drafters are trained. The shipped family travels packed in git: to ship
    a retrained one, pack its weights (`python -m trtspec.artifacts.packed pack target/model.safetensors ...`,
    see docs/methods-and-training.md).

    \b
    Example (retrain the shipped family's drafters into a scratch dir):
      trtspec models train-demo --target examples/models/target --out /tmp/family
    """
    from rich.console import Console

    from trtspec.errors import UsageError
    from trtspec.train import demo

    if target is not None and (counts.get("target_steps") is not None or counts.get("target_batch") is not None):
        raise UsageError("--target reuses a trained target: --target-steps/--target-batch do not apply",
                         hint="drop them, or drop --target to train a new target")
    cfg = demo.FamilyConfig.quick_config(seed) if quick else replace(demo.FamilyConfig(), seed=seed)
    cfg = cfg.with_counts(threads=threads, **counts)
    console = Console(stderr=True)
    progress, report = _progress_reporter(console)
    with progress:
        manifest = demo.train_family(out, cfg, report=report, force=force, log=console.log, target=target)
    summary = {name: {k: m[k] for k in ("params", "loss", "acceptance") if k in m}
               for name, m in manifest["models"].items()}
    console.print_json(json.dumps(summary))
    click.echo(f"wrote {out} in {manifest['wall_s_total']:.0f}s")
