"""`trtspec bench`: speculative vs. plain decoding side by side, as a table."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.options import grpc_client_options, json_option


@click.command()
@click.option("-c", "--config", "configs", multiple=True, default=["trtspec.toml"], show_default=True,
              envvar="TRTSPEC_CONFIG", type=click.Path(dir_okay=False),
              help="Deployment spec; repeat to compare several drafters in one table.")
@click.option("--local", is_flag=True, help="Benchmark in-process with the torch runtime.")
@click.option("--url", envvar="TRTSPEC_URL", metavar="HOST:PORT",
              help="Benchmark a running server over gRPC (default: the one `trtspec serve` started).")
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False),
              help="Prompts: .jsonl with a \"prompt\" key, or text with prompts separated by blank lines "
                   "(default: held-out prompts of the demo family).")
@click.option("-n", "--num-prompts", default=12, show_default=True, type=click.IntRange(min=1),
              help="How many prompts to run.")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(min=1),
              help="New tokens per request.")
@click.option("--chat", is_flag=True, help="Each prompt is a user message, rendered with the tokenizer's chat "
              "template (by the server for --url).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also write a PNG bar chart.")
@grpc_client_options
@json_option
def bench(configs, local, url, prompts_file, num_prompts, max_tokens, chat, plot_path, as_json, grpc_options) -> None:
    """Measure speculative decoding against plain decoding of the same target, request by
    request in one run (batch 1, greedy): tokens/s, latency, TTFT, acceptance, tokens per step,
    the speedup, and whether the outputs were identical.

    \b
    Examples:
      trtspec bench --local -c examples/demo/draft-model.toml -c examples/demo/eagle.toml
      trtspec bench -c examples/demo/draft-model.toml --max-tokens 64 --json
      trtspec bench --local -c examples/smollm2/lookahead.toml --chat --prompts examples/smollm2/chat.jsonl
    """
    from rich.console import Console
    from rich.progress import Progress

    from trtspec.bench import compare as cmp
    from trtspec.spec import load_spec

    console = Console(stderr=True)
    reports = []
    for config in configs:
        spec = load_spec(config)
        prompts = cmp.read_prompts(Path(prompts_file)) if prompts_file else cmp.default_prompts(spec, num_prompts)
        prompts = prompts[:num_prompts]
        if local:
            runner, where = cmp.local_runner(spec, max_tokens, chat), "in-process"
        else:
            from trtspec.client import resolve_url

            target = resolve_url(url, config)
            runner, where = cmp.remote_runner(target, max_tokens, options=grpc_options, chat=chat), f"served ({target})"
        with Progress(console=console, transient=True, disable=as_json) as progress:
            task = progress.add_task(f"{spec.name}", total=len(prompts))
            reports.append(cmp.compare(spec, prompts, runner, max_tokens=max_tokens, where=where,
                                       progress=lambda done, _total: progress.update(task, completed=done)))
    if plot_path:
        cmp.plot(reports, Path(plot_path))
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in reports], indent=2))
        return
    _table(reports, console)
    if plot_path:
        console.print(f"plot: {plot_path}")


def _table(reports, console) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{reports[0].where}, batch 1, greedy, {reports[0].max_tokens} new tokens")
    for col in ("method", "n", "plain tok/s", "spec tok/s", "speedup", "accept", "tok/step", "p50 plain",
                "p50 spec", "TTFT", "same"):
        table.add_column(col, justify="right", no_wrap=col == "method")
    for r in reports:
        s, p = r.spec.to_dict(), r.plain.to_dict()
        ttft = f"{s['ttft_p50_s'] * 1000:.0f}ms" if s["ttft_p50_s"] is not None else "-"
        table.add_row(r.method, str(r.spec.requests), f"{p['tokens_per_second']:.1f}",
                      f"{s['tokens_per_second']:.1f}", f"{r.speedup:.2f}x", f"{s['acceptance_rate']:.2f}",
                      f"{s['tokens_per_step']:.2f}", f"{p['latency_p50_s']:.2f}s", f"{s['latency_p50_s']:.2f}s", ttft,
                      f"{r.identical}/{r.spec.requests}")
    Console(width=max(Console().width, 110)).print(table)


def register(main: click.Group) -> None:
    main.add_command(bench)
