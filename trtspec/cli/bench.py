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
@click.option("--prompts", "prompts_file", metavar="FILE|builtin:NAME",
              help="Prompts: .jsonl with a \"prompt\" key, text with prompts separated by blank lines, or a "
                   "built-in set builtin:code|chat|edit|mixed (default: held-out prompts of the demo family).")
@click.option("--concurrency", "concurrency", metavar="N,N,...",
              help="Load grid: concurrent clients per point, e.g. 1,4,16 (with --num-draft-tokens: the grid mode).")
@click.option("--num-draft-tokens", "ks", metavar="K,K,...",
              help="Load grid: fixed K per point, 0 = no speculation, auto = the deployment's own (adaptive K "
                   "under its schedule), e.g. 0,2,4,auto (default with --concurrency: 0,auto).")
@click.option("--model", "model", metavar="NAME", help="Served ensemble to send to (default: serving.ensemble_name).")
@click.option("--metrics-url", metavar="URL", help="The server's Prometheus endpoint, for per-position acceptance "
              "(default: the one `trtspec serve` recorded for the spec).")
@click.option("-o", "--output", "output", type=click.Path(dir_okay=False),
              help="Also write the JSON report to this file (atomically).")
@click.option("-n", "--num-prompts", default=12, show_default=True, type=click.IntRange(min=1),
              help="How many prompts to run.")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(min=1),
              help="New tokens per request.")
@click.option("--chat", is_flag=True, help="Each prompt is a user message, rendered with the tokenizer's chat "
              "template (by the server for --url).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also write a PNG bar chart.")
@grpc_client_options
@json_option
def bench(configs, local, url, prompts_file, concurrency, ks, model, metrics_url, output, num_prompts, max_tokens, chat,
          plot_path, as_json, grpc_options) -> None:
    """Measure speculative decoding against plain decoding of the same target, request by
    request in one run (batch 1, greedy): tokens/s, latency, TTFT, acceptance, tokens per step,
    the speedup, and whether the outputs were identical.

    \b
    Examples:
      trtspec bench --local -c examples/demo/draft-model.toml -c examples/demo/eagle.toml
      trtspec bench -c examples/demo/draft-model.toml --max-tokens 64 --json
      trtspec bench --local -c examples/smollm2/lookahead.toml --chat --prompts examples/smollm2/chat.jsonl
      trtspec bench -c examples/demo/eagle.toml --concurrency 1,4,16 --num-draft-tokens 0,2,4 --plot grid.png

    With --concurrency / --num-draft-tokens: a concurrency x K grid in one run (requests/s, output tok/s,
    TTFT and inter-token latency p50/p90/p99, acceptance, tokens/step, per-position acceptance, speedup over
    K = 0 at the same concurrency, ideal speedup, greedy mismatches against K = 0).
    """
    if concurrency or ks:
        return _grid(configs, local, url, prompts_file, concurrency or "1", ks or "0,auto", model, metrics_url,
                     output, num_prompts, max_tokens, chat, plot_path, as_json, grpc_options)
    from rich.console import Console
    from rich.progress import Progress

    from trtspec.bench import compare as cmp
    from trtspec.check import load_spec

    console = Console(stderr=True)
    reports = []
    for config in configs:
        spec = load_spec(config)
        prompts = _prompts(prompts_file, spec, num_prompts)
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
    if output:
        _write_json(output, [r.to_dict() for r in reports])
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
    out = Console(width=max(Console().width, 110))
    out.print(table)
    from trtspec.cli.status import cost_table

    for r in reports:
        if r.costs:
            out.print(cost_table(r.costs, f"{r.name}: the costs adaptive K priced with ({r.costs['source']})"))


def _prompts(source: str | None, spec, n: int) -> list[str]:
    """--prompts: builtin:NAME, a file, or the demo family's held-out prompts; the first `n`."""
    from trtspec.bench import compare as cmp
    from trtspec.bench.prompts import SETS, builtin

    if source and source.startswith("builtin:"):
        name = source.split(":", 1)[1]
        if name not in SETS:
            raise click.BadParameter(f"no built-in prompt set {name!r} (known: {', '.join(SETS)})",
                                     param_hint="--prompts")
        prompts = builtin(name)
    elif source:
        if not Path(source).is_file():
            raise click.BadParameter(f"file {source!r} does not exist", param_hint="--prompts")
        prompts = cmp.read_prompts(Path(source))
    else:
        prompts = cmp.default_prompts(spec, n)
    return prompts[:n]


def _write_json(path: str, data) -> None:
    from trtspec.artifacts.fs import write_json

    write_json(Path(path), data)


def _metrics_url(spec, url: str | None, given: str | None) -> str | None:
    """--metrics-url, else the one `trtspec serve` recorded for the spec when --url is that server's (or absent)."""
    if given:
        return given
    from trtspec.client.connect import normalize_url
    from trtspec.state import read_state, state_path

    state = read_state(state_path(spec.name)) or {}
    if state.get("metrics_url") and (url is None or (state.get("grpc_url")
                                                     and normalize_url(url) == normalize_url(state["grpc_url"]))):
        return state["metrics_url"]
    return None


def _grid(configs, local, url, prompts_file, concurrency, ks, model, metrics_url, output, num_prompts, max_tokens,
          chat, plot_path, as_json, grpc_options) -> None:
    from rich.console import Console
    from rich.progress import Progress

    from trtspec.bench import load
    from trtspec.check import load_spec

    try:
        concurrencies = load.parse_concurrencies(concurrency)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--concurrency") from None
    try:
        k_list = load.parse_ks(ks)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--num-draft-tokens") from None
    console = Console(stderr=True)
    grids = []
    for config in configs:
        spec = load_spec(config)
        prompts = _prompts(prompts_file, spec, num_prompts)
        target = None
        if not local:
            from trtspec.client import resolve_url

            target = resolve_url(url, config)
        with Progress(console=console, transient=True, disable=as_json) as progress:
            task = progress.add_task(spec.name, total=len(concurrencies) * len(k_list))

            def step(what: str, done: int, total: int) -> None:
                progress.update(task, completed=done, total=total, description=f"{spec.name}: {what}")

            grids.append(load.measure(spec, prompts, concurrencies, k_list, max_tokens=max_tokens, url=target,
                                      model=model, metrics_url=None if local else _metrics_url(spec, url, metrics_url),
                                      options=grpc_options, chat=chat, progress=step))
    data = [g.to_dict() for g in grids]
    if output:
        _write_json(output, data)
    if plot_path:
        load.plot_grid(grids, Path(plot_path))
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    for g in grids:
        grid_table(g, console)
    if plot_path:
        console.print(f"plot: {plot_path}")


def _ms(x) -> str:
    return "-" if x is None else f"{x * 1000:.0f}" if x >= 0.01 else f"{x * 1000:.1f}"


def grid_table(g, console=None) -> None:
    """The grid as one rich table (also printed by `trtspec tune`)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{g.name} ({g.method}), {g.where}: {g.prompts} prompts x {g.max_tokens} new tokens, greedy")
    for col in ("conc", "K", "req/s", "out tok/s", "speedup", "ideal", "TTFT p50/p90/p99 ms", "ITL p50/p90/p99 ms",
                "accept", "tok/step", "per position", "diff"):
        table.add_column(col, justify="right")
    for p in g.points:
        d = p.to_dict()
        lat = [" / ".join(_ms(d[key][q]) for q in ("p50", "p90", "p99")) for key in ("ttft_s", "itl_s")]
        pos = " ".join(f"{a:.2f}" for a in p.per_position[:6]) if p.per_position else "-"
        k = p.label if p.k is not None else f"auto ({p.mean_k:.1f})"
        table.add_row(str(p.concurrency), k, f"{p.requests_per_second:.2f}", f"{p.tokens_per_second:.1f}",
                      "-" if p.speedup is None else f"{p.speedup:.2f}x", f"{p.ideal_speedup:.2f}x", lat[0], lat[1],
                      f"{p.acceptance:.2f}", f"{p.tokens_per_step:.2f}", pos,
                      "-" if p.mismatches is None else str(p.mismatches))
    Console(width=max(Console().width, 150)).print(table)


def register(main: click.Group) -> None:
    main.add_command(bench)
