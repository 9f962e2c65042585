"""`trtspec train eagle3 | eagle | medusa | draft-model`: train a drafter for the spec's target
(trtspec.train.drafters)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.options import config_option, json_option


def register(main: click.Group) -> None:
    main.add_command(train)


@click.group("train")
def train() -> None:
    """Train a drafter for the spec's target: the target answers a prompt set itself (or plain text is
    read), its features are cached once, a head is trained under a budget and written with a manifest
    (trtspec.train.json: data, budget, losses, measured acceptance) next to its weights."""


def _common(f):
    """The options every kind shares: the data, the budget, the run (one work dir can serve every kind)."""
    opts = [
        config_option,
        click.option("--data", default="builtin:mix", show_default=True,
                     help="builtin:mix|chat|code (prompts the target answers), a .jsonl of {\"prompt\"}, "
                          "{\"messages\"} or {\"text\"} rows, or a .txt (plain text)."),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path),
                     help="Directory to write, replaced atomically (default: the spec's speculative.heads or "
                          ".draft, else <target>-<kind> beside the target)."),
        click.option("--steps", type=click.IntRange(1), help="Optimizer steps (a budget: --steps or --minutes)."),
        click.option("--minutes", type=click.FloatRange(0.05), help="Wall-clock training budget in minutes."),
        click.option("--device", type=click.Choice(["cpu", "cuda"]), help="Where to train (default: runtime.device)."),
        click.option("--resume", is_flag=True, help="Continue from the work dir's checkpoint of the same run; a "
                                                    "larger budget than it had extends a finished run."),
        click.option("--samples", type=click.IntRange(1), default=512, show_default=True,
                     help="Training samples: prompts the target answers (repeated when the set is smaller), or "
                          "text chunks."),
        click.option("--max-new-tokens", type=click.IntRange(8, 4096), default=192, show_default=True,
                     help="Longest answer the target writes per prompt."),
        click.option("--draft-vocab", type=click.IntRange(16), default=8192, show_default=True,
                     help="Draft vocabulary size (the most frequent target tokens of the data; the teacher rows "
                          "every kind learns from). Give a run's own value to reuse its features."),
        click.option("--lr", type=click.FloatRange(0, min_open=True), default=6e-4, show_default=True),
        click.option("--batch-tokens", type=click.IntRange(64), default=4096, show_default=True,
                     help="Padded tokens per optimizer step."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--threads", type=click.IntRange(1),
                     help="torch intra-op threads (default: runtime.torch.threads)."),
        click.option("--work", type=click.Path(file_okay=False, path_type=Path),
                     help="Work dir for the data, features and checkpoints (default: .trtspec/train/<out name>); "
                          "another kind's work dir reuses its data and features."),
        click.option("--until", type=click.Choice(["data", "features"]),
                     help="Stop after this stage (it stays cached in the work dir): run long stages as separate "
                          "jobs."),
        json_option,
    ]
    for o in reversed(opts):
        f = o(f)
    return f


@train.command("eagle3")
@_common
@click.option("--ttt-steps", type=click.IntRange(1, 16), default=4, show_default=True,
              help="Training-time-test steps unrolled per position.")
def eagle3(ttt_steps, **kw) -> None:
    """Train an EAGLE-3 head (LlamaForCausalLMEagle3: what vLLM and TensorRT-LLM's PyTorch backend load)
    for the spec's model.target. Serve it with method = "eagle" and speculative.heads = the --out dir.

    \b
    Example:
      trtspec train eagle3 -c examples/smollm2/eagle3.toml --minutes 20
    """
    _run("eagle3", kw, ttt_steps=ttt_steps)


@train.command("eagle")
@_common
@click.option("--noise", type=click.FloatRange(0), default=0.1, show_default=True,
              help="Uniform noise on the input features (EAGLE-1's recipe).")
def eagle(noise, **kw) -> None:
    """Train an EAGLE-1 head (one decoder layer on the target's last hidden state; what the engine runtime
    serves) for the spec's model.target. Serve it with method = "eagle" and speculative.heads = the --out dir.

    \b
    Example:
      trtspec train eagle -c examples/smollm2/eagle3.toml --out .trtspec/heads/smollm2-eagle1 \\
          --work .trtspec/train/smollm2-135m-instruct-eagle3 --draft-vocab 4096 --minutes 15
    """
    _run("eagle", kw, noise=noise)


@train.command("medusa")
@_common
@click.option("--heads", "medusa_heads", type=click.IntRange(1, 8), default=4, show_default=True,
              help="Medusa heads (head h predicts the token 2 + h ahead).")
def medusa(medusa_heads, **kw) -> None:
    """Train Medusa heads (the TensorRT-LLM Medusa layout) on the target's last hidden state. Serve them
    with method = "medusa" and speculative.heads = the --out dir."""
    _run("medusa", kw, medusa_heads=medusa_heads)


@train.command("draft-model")
@_common
@click.option("--layers", "draft_layers", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Decoder layers of the draft.")
@click.option("--hidden", "draft_hidden", type=click.IntRange(8), help="Width of the draft (default: the target's).")
def draft_model(draft_layers, draft_hidden, **kw) -> None:
    """Distil a small Llama draft (the target's tokenizer and vocabulary) from the target's distributions.
    Serve it with method = "draft-model" and speculative.draft = the --out dir."""
    _run("draft-model", kw, draft_layers=draft_layers, draft_hidden=draft_hidden)


def _run(kind: str, o: dict, **own) -> None:
    import torch
    from rich.console import Console

    from trtspec import methods
    from trtspec.artifacts import manifest
    from trtspec.check import load_spec
    from trtspec.errors import UsageError
    from trtspec.train import drafters

    if o["steps"] is None and o["minutes"] is None and o["until"] is None:
        raise UsageError("no training budget", hint="pass --steps N or --minutes M")
    spec = load_spec(o["config"])
    weights = methods.get(drafters.METHOD[kind]).weights  # the spec key of the drafter's dir: draft or heads
    out = o["out"]
    if out is None:  # the spec's drafter dir when the spec serves this kind, never another kind's drafter
        given = getattr(spec.speculative, weights)
        given = given if spec.speculative.method == drafters.METHOD[kind] else None
        out = Path(given) if given else drafters.default_out(Path(spec.model.target), kind)
        made = manifest.read(out / manifest.FILE_NAMES[manifest.TRAIN], manifest.TRAIN) if out.is_dir() else None
        if made is not None and made.get("method") != kind:
            raise UsageError(f"{out} holds a trained {made.get('method')} drafter; `train {kind}` would replace it",
                             hint="pass --out DIR for this one")
    threads = o["threads"] or spec.runtime.torch.threads
    if threads:
        torch.set_num_threads(threads)
    cfg = drafters.TrainConfig(data=o["data"], samples=o["samples"], max_new_tokens=o["max_new_tokens"],
                               draft_vocab=o["draft_vocab"], steps=o["steps"], minutes=o["minutes"], lr=o["lr"],
                               batch_tokens=o["batch_tokens"], seed=o["seed"],
                               device=o["device"] or spec.runtime.device, **own)
    console = Console(stderr=True)
    progress, report = _reporter(console)
    log = (lambda s: None) if o["as_json"] else console.log
    with progress:
        m = drafters.train_drafter(kind, Path(spec.model.target), out, cfg, resume=o["resume"], work=o["work"],
                                   report=report, log=log, until=o["until"], weights=weights)
    if m is None:
        click.echo(f"stopped after the {o['until']} stage (cached; run again with a budget to train)")
        return
    if o["as_json"]:
        click.echo(json.dumps({k: m[k] for k in ("budget", "acceptance", "draft_vocab_size", "aux_layers", "params")
                               if k in m}, indent=2))
        return
    acc = m["acceptance"]
    for name in ("chain", "tree"):
        if name in acc:
            a = acc[name]
            click.echo(f"{name:<5} K={a['k']}: {a['tokens_per_step']:.2f} tokens/step, acceptance "
                       f"{a['acceptance_rate']:.2f}, identical to plain {a['matches_plain_greedy']}")
    click.echo(f"wrote {out} ({m['params'] / 1e6:.1f}M trained parameters, draft vocabulary {m['draft_vocab_size']}, "
               f"{m['budget']['steps_done']} steps in {m['budget']['wall_s']['train']:.0f}s)")


def _reporter(console):
    """One rich progress bar per stage (data, features, train, measure); plain log lines when not a terminal.
    A --minutes run learns its step count after its first steps (total 0 until then)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(TextColumn("[bold]{task.fields[phase]:<8}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[loss]}"), TimeElapsedColumn(), TimeRemainingColumn(), console=console)
    tasks: dict[str, int] = {}

    def report(phase: str, step: int, total: int, loss: float | None) -> None:
        text = f"loss {loss:.3f}" if loss is not None else ""
        if phase not in tasks:
            tasks[phase] = progress.add_task(phase, total=total or None, phase=phase, loss="")
        progress.update(tasks[phase], completed=step, total=total or None, loss=text)
        if not console.is_terminal and (step == total or step % max(1, (total or 100) // 20) == 0):
            console.log(f"{phase} {step}/{total or '?'} {text}")

    return progress, report
