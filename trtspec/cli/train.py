"""`trtspec train eagle3`: train a drafter for the spec's target (trtspec.train.drafters)."""

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


@train.command("eagle3")
@config_option
@click.option("--data", default="builtin:mix", show_default=True,
              help="builtin:mix|chat|code (prompts the target answers), a .jsonl of {\"prompt\"}, {\"messages\"} "
                   "or {\"text\"} rows, or a .txt (plain text).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Head directory to write, replaced atomically (default: the spec's speculative.heads, else "
                   "<target>-eagle3 beside the target).")
@click.option("--steps", type=click.IntRange(1), help="Optimizer steps (a budget: --steps or --minutes).")
@click.option("--minutes", type=click.FloatRange(0.05), help="Wall-clock training budget in minutes.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), help="Where to train (default: runtime.device).")
@click.option("--resume", is_flag=True, help="Continue from the work dir's checkpoint of the same run.")
@click.option("--samples", type=click.IntRange(1), default=512, show_default=True,
              help="Training samples: prompts the target answers (repeated when the set is smaller), or text chunks.")
@click.option("--max-new-tokens", type=click.IntRange(8, 4096), default=192, show_default=True,
              help="Longest answer the target writes per prompt.")
@click.option("--draft-vocab", type=click.IntRange(16), default=8192, show_default=True,
              help="Draft vocabulary size (the most frequent target tokens of the data).")
@click.option("--ttt-steps", type=click.IntRange(1, 16), default=4, show_default=True,
              help="Training-time-test steps unrolled per position.")
@click.option("--lr", type=click.FloatRange(0, min_open=True), default=6e-4, show_default=True)
@click.option("--batch-tokens", type=click.IntRange(64), default=4096, show_default=True,
              help="Padded tokens per optimizer step.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=click.IntRange(1), help="torch intra-op threads (default: runtime.torch.threads).")
@click.option("--work", type=click.Path(file_okay=False, path_type=Path),
              help="Work dir for the data, features and checkpoints (default: .trtspec/train/<out name>).")
@click.option("--until", type=click.Choice(["data", "features"]),
              help="Stop after this stage (it stays cached in the work dir): run long stages as separate jobs.")
@json_option
def eagle3(config, data, out, steps, minutes, device, resume, samples, max_new_tokens, draft_vocab, ttt_steps, lr,
           batch_tokens, seed, threads, work, until, as_json) -> None:
    """Train an EAGLE-3 head (LlamaForCausalLMEagle3: what vLLM and TensorRT-LLM's PyTorch backend load)
    for the spec's model.target. Serve it with method = "eagle" and speculative.heads = the --out dir.

    \b
    Example:
      trtspec train eagle3 -c examples/smollm2/eagle3.toml --minutes 20
    """
    import torch
    from rich.console import Console

    from trtspec.errors import UsageError
    from trtspec.spec import load_spec
    from trtspec.train import drafters

    if steps is None and minutes is None and until is None:
        raise UsageError("no training budget", hint="pass --steps N or --minutes M")
    spec = load_spec(config)
    if out is None:
        out = Path(spec.speculative.heads) if spec.speculative.heads else drafters.default_out(Path(spec.model.target))
    threads = threads or spec.runtime.torch.threads
    if threads:
        torch.set_num_threads(threads)
    cfg = drafters.TrainConfig(data=data, samples=samples, max_new_tokens=max_new_tokens, draft_vocab=draft_vocab,
                               steps=steps, minutes=minutes, ttt_steps=ttt_steps, lr=lr, batch_tokens=batch_tokens,
                               seed=seed, device=device or spec.runtime.device)
    console = Console(stderr=True)
    progress, report = _reporter(console)
    log = (lambda s: None) if as_json else console.log
    with progress:
        m = drafters.train_eagle3(Path(spec.model.target), out, cfg, resume=resume, work=work, report=report, log=log,
                                  until=until)
    if m is None:
        click.echo(f"stopped after the {until} stage (cached; run again with a budget to train)")
        return
    if as_json:
        click.echo(json.dumps({k: m[k] for k in ("budget", "acceptance", "draft_vocab_size", "aux_layers", "params")},
                              indent=2))
        return
    acc = m["acceptance"]
    for name in ("chain", "tree"):
        if name in acc:
            a = acc[name]
            click.echo(f"{name:<5} K={a['k']}: {a['tokens_per_step']:.2f} tokens/step, acceptance "
                       f"{a['acceptance_rate']:.2f}, identical to plain {a['matches_plain_greedy']}")
    click.echo(f"wrote {out} ({m['params'] / 1e6:.1f}M parameters, draft vocabulary {m['draft_vocab_size']}, "
               f"{m['budget']['steps_done']} steps in {m['budget']['wall_s']['train']:.0f}s)")


def _reporter(console):
    """One rich progress bar per stage (data, features, train, measure); plain log lines when not a terminal.
    A --minutes run learns its step count after its first steps (total 0 until then)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

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
