"""`trtspec tune`: sweep concurrency x K, write the best K per load band into the spec as speculative.schedule."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import click

from trtspec.cli.options import config_option, grpc_client_options, json_option


@click.command()
@config_option
@click.option("--local", is_flag=True, help="Sweep in-process with the torch runtime (then the tuned spec is "
              "measured again: before/after).")
@click.option("--url", envvar="TRTSPEC_URL", metavar="HOST:PORT",
              help="Sweep a running server over gRPC (default: the one `trtspec serve` started).")
@click.option("--model", metavar="NAME", help="Served ensemble (default: serving.ensemble_name).")
@click.option("--prompts", "prompts_file", metavar="FILE|builtin:NAME", help="Prompts, as for `trtspec bench`.")
@click.option("--concurrency", default="1,4,16", show_default=True, metavar="N,N,...",
              help="Loads to tune for (concurrent clients).")
@click.option("--num-draft-tokens", "ks", metavar="K,K,...",
              help="K values to try (default: 0, 1, 2, 4, ... up to speculative.num_draft_tokens).")
@click.option("-n", "--num-prompts", default=8, show_default=True, type=click.IntRange(min=1))
@click.option("--max-tokens", default=64, show_default=True, type=click.IntRange(min=1))
@click.option("--dry-run", is_flag=True, help="Show the schedule, leave the spec as it is.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Also write the JSON report to this file.")
@grpc_client_options
@json_option
def tune(config, local, url, model, prompts_file, concurrency, ks, num_prompts, max_tokens, dry_run, output, as_json,
         grpc_options) -> None:
    """Find the best K per load band and write it into the spec as `speculative.schedule` (comments kept).

    The torch runtime caps K by that schedule at each step's batch size; the LLM API runtime gets it as
    `draft_len_schedule` (floored at 1: a drafter's state must not go stale in a zero band). Shown before
    (the deployment as it is: K auto) and after (in-process: the tuned spec measured again; served: the
    chosen fixed-K points, since the server runs the old spec until you deploy the new one).

    \b
    Examples:
      trtspec tune --local -c examples/demo/draft-model.toml --concurrency 1,4 --prompts builtin:code
      trtspec tune -c trtspec.toml --url localhost:8001 --dry-run
    """
    from rich.console import Console

    from trtspec.bench import load, tune as tuning
    from trtspec.check import load_spec
    from trtspec.cli.bench import _metrics_url, _prompts, _write_json, grid_table

    console = Console(stderr=True)
    spec = load_spec(config)
    tuning.check_tunable(spec)  # (a routed spec has no one K to schedule: refused before the sweep)
    k_max = spec.speculative.num_draft_tokens
    try:
        concurrencies = load.parse_concurrencies(concurrency)
        k_list = load.parse_ks(ks) if ks else sorted({0, k_max} | {2 ** i for i in range(7) if 2 ** i <= k_max})
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--concurrency / --num-draft-tokens") from None
    if None in k_list or max(k_list) > k_max:
        raise click.BadParameter(f"give whole numbers in 0..{k_max} (speculative.num_draft_tokens)",
                                 param_hint="--num-draft-tokens")
    prompts = _prompts(prompts_file, spec, num_prompts)
    target = None
    if not local:
        from trtspec.client import resolve_url

        target = resolve_url(url, config)
    common = dict(max_tokens=max_tokens, url=target, model=model, options=grpc_options,
                  metrics_url=None if local else _metrics_url(spec, url, None))
    with (console.status("tuning: sweeping concurrency x K", spinner="dots") if not as_json
          else contextlib.nullcontext()):
        grid = load.measure(spec, prompts, concurrencies, [*k_list, None], **common)
    schedule = tuning.best_schedule(grid, spec)
    before = {c: grid.point(c, None) for c in concurrencies}
    after_spec = spec
    if not dry_run:
        after_spec = tuning.write_schedule(Path(config), schedule)
    after_where = "the chosen fixed-K points"
    if local:
        if dry_run:
            from trtspec.check import spec_from_dict

            data = spec.to_dict()
            data["speculative"]["schedule"] = {str(b): k for b, k in schedule.items()}
            after_spec = spec_from_dict(data, source=spec.source)
        with (console.status("tuning: measuring the tuned spec", spinner="dots") if not as_json
              else contextlib.nullcontext()):
            after_grid = load.measure(after_spec, prompts, concurrencies, [0, None], **common)
        after = {c: after_grid.point(c, None) for c in concurrencies}
        base_after = {c: after_grid.point(c, 0) for c in concurrencies}
        after_where = "the tuned spec, measured"
    else:
        from trtspec.spec import schedule_k

        after = {c: grid.point(c, schedule_k(schedule, k_max, min(c, spec.limits.max_batch_size)))
                 for c in concurrencies}
        base_after = {c: grid.point(c, 0) for c in concurrencies}
    rows = []
    for c in concurrencies:
        b0, a0 = grid.point(c, 0), base_after[c]
        rows.append({"concurrency": c,
                     "plain_tokens_per_s": b0.tokens_per_second if b0 else None,
                     "before_tokens_per_s": before[c].tokens_per_second,
                     "before_speedup": before[c].tokens_per_second / b0.tokens_per_second if b0 else None,
                     "after_tokens_per_s": after[c].tokens_per_second if after[c] else None,
                     "after_speedup": (after[c].tokens_per_second / a0.tokens_per_second
                                       if after[c] and a0 and a0.tokens_per_second else None)})
    report = {"spec": str(config), "schedule": {str(b): k for b, k in schedule.items()},
              "written": not dry_run, "after": after_where, "bands": rows, "grid": grid.to_dict()}
    from trtspec.spec import draft_len_schedule

    report["draft_len_schedule"] = {str(b): k for b, k in (draft_len_schedule(after_spec) or {}).items()} \
        if after_spec.speculative.schedule else None
    if output:
        _write_json(output, report)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    grid_table(grid, console)
    _before_after(rows, after_where, console)
    console.print(f"schedule: speculative.schedule = {tuning.render_schedule(schedule)}"
                  + ("  (dry run: not written)" if dry_run else f"  written to {config}"))
    if report["draft_len_schedule"]:
        console.print(f"trtllm-llmapi: draft_len_schedule = {report['draft_len_schedule']} (floored at 1)")


def _before_after(rows, after_where: str, console) -> None:
    from rich.console import Console
    from rich.table import Table

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    table = Table(title=f"before (K auto) / after ({after_where}), output tokens/s")
    for col in ("conc", "K=0 tok/s", "before tok/s", "before x K=0", "after tok/s", "after x K=0"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(str(r["concurrency"]), f(r["plain_tokens_per_s"], ".1f"), f(r["before_tokens_per_s"], ".1f"),
                      f(r["before_speedup"], ".2f"), f(r["after_tokens_per_s"], ".1f"), f(r["after_speedup"], ".2f"))
    Console(width=max(Console().width, 110)).print(table)


def register(main: click.Group) -> None:
    main.add_command(tune)
