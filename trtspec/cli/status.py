"""`trtspec status`: a running server's models, versions, readiness and spec-decode metrics at a glance."""

from __future__ import annotations

import json

import click

from trtspec.cli.options import admin_key_option, json_option


@click.command()
@click.option("-c", "--config", "config", envvar="TRTSPEC_CONFIG", type=click.Path(dir_okay=False),
              help="Spec of the deployment (its models are asked even without the admin key; default URLs from "
                   "the server `trtspec serve` recorded for it).")
@click.option("--url", envvar="TRTSPEC_HTTP_URL", metavar="HOST:HTTP_PORT", help="Triton's HTTP endpoint.")
@click.option("--metrics-url", metavar="URL", help="Prometheus endpoint (default: the recorded one, else the "
              "HTTP host with serving.metrics_port).")
@admin_key_option
@json_option
def status(config, url, metrics_url, admin_key, as_json) -> None:
    """Show what a Triton server runs: live/ready, every model's version, state, readiness and deploy
    revision, and per generation model its requests, acceptance, tokens/step and per-position acceptance
    (from its Prometheus metrics; a routed deployment also per drafter) and the cost table its adaptive K
    prices with (spec_dec_verify_cost_seconds by rows, spec_dec_draft_cost_seconds by drafter) and, per
    drafter, the acceptance it prices new requests at under load and how many it priced off there
    (spec_dec_shared_acceptance, spec_dec_priced_off_requests_total), plus Triton's inference and queue counters.

    The model list comes from the repository index, which needs the admin key (--admin-key, or the key
    `trtspec serve` recorded); without it only the spec's models are shown.

    \b
    Examples:
      trtspec status -c examples/demo/draft-model.toml
      trtspec status --url localhost:8000 --metrics-url http://localhost:8002/metrics --json
    """
    from trtspec.serve import admin_key_for
    from trtspec.serve.control import server_status

    models: list[str] = []
    state = {}
    if config:
        from trtspec.check import load_spec
        from trtspec.state import read_state, state_path

        spec = load_spec(config)
        models = [spec.serving.ensemble_name]
        state = read_state(state_path(spec.name)) or {}
        url = url or state.get("http_url") or f"localhost:{spec.serving.http_port}"
        if not metrics_url:
            metrics_url = state.get("metrics_url") if state.get("http_url") == url else None
            metrics_url = metrics_url or f"http://{url.rsplit(':', 1)[0]}:{spec.serving.metrics_port}/metrics"
    if not url:
        raise click.UsageError("pass --url HOST:HTTP_PORT or -c SPEC")
    out = server_status(url, admin_key or state.get("admin_key") or admin_key_for(url), models, metrics_url)
    if as_json:
        click.echo(json.dumps(out, indent=2))
        return
    _print(out)


def _print(out) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"{out['url']}: live {'yes' if out['live'] else 'NO'}, ready {'yes' if out['ready'] else 'NO'}"
                  f"  ({out['index']})")
    models = Table(title="models")
    for col in ("model", "version", "state", "ready", "revision", "reason"):
        models.add_column(col)
    for name, m in sorted(out["models"].items()):
        models.add_row(name, str(m.get("version") or "-"), str(m.get("state") or "-"), "yes" if m["ready"] else "no",
                       str(m.get("revision") or "-"), str(m.get("reason") or ""))
    console.print(models)
    metrics = out.get("metrics")
    if metrics:
        table = Table(title="spec-decode metrics (since the server started)")
        for col in ("model", "method", "requests", "failures", "tokens", "accept", "tok/step", "per position",
                    "inferences", "avg queue"):
            table.add_column(col, justify="right")
        for name, m in sorted(metrics.items()):
            if "requests" not in m and "inferences" not in m:
                continue
            pos = " ".join(f"{a:.2f}" for a in (m.get("per_position_acceptance") or [])[:6]) or "-"
            table.add_row(name, str(m.get("method") or "-"), str(m.get("requests", "-")), str(m.get("failures", "-")),
                          str(m.get("generated_tokens", "-")),
                          f"{m['acceptance_rate']:.2f}" if "acceptance_rate" in m else "-",
                          f"{m['tokens_per_step']:.2f}" if "tokens_per_step" in m else "-", pos,
                          str(m.get("inferences", "-")),
                          f"{m['avg_queue_us'] / 1000:.1f} ms" if "avg_queue_us" in m else "-")
        console.print(table)
        routed = Table(title="per drafter (routed deployments)")
        for col in ("model", "drafter", "steps", "draft tokens", "accept", "tok/step"):
            routed.add_column(col, justify="right")
        for name, m in sorted(metrics.items()):
            for drafter, d in (m.get("drafters") or {}).items():
                routed.add_row(name, drafter, str(d["steps"]), str(d["draft_tokens"]), f"{d['acceptance_rate']:.2f}",
                               f"{d['tokens_per_step']:.2f}")
        if routed.row_count:
            console.print(routed)
        for name, m in sorted(metrics.items()):
            if m.get("costs"):
                console.print(cost_table(m["costs"], f"{name}: cost table (adaptive K)"))
        load = Table(title="under load (adaptive K prices a new request in a step of several at its drafter's "
                           "shared acceptance)")
        for col in ("model", "drafter", "shared acceptance", "new requests priced off"):
            load.add_column(col, justify="right")
        for name, m in sorted(metrics.items()):
            for drafter, d in (m.get("under_load") or {}).items():
                alpha = d["shared_acceptance"]
                load.add_row(name, drafter, "-" if alpha is None else f"{alpha:.2f}", str(d["priced_off_requests"]))
        if load.row_count:
            console.print(load)
    elif out.get("metrics_error"):
        console.print(f"metrics: {out['metrics_error']}")


def cost_table(costs: dict, title: str):
    """A rich table of a cost table's dict (runtime.costs.CostTable.to_dict's shape): verify seconds by rows
    (and relative to one row), then each drafter's draft step (for one request, then for B requests together
    where the table has them)."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("pass", "ms", "x 1 row"):
        table.add_column(col, justify="right")
    verify = {int(k): float(v) for k, v in costs["verify"].items()}
    one = verify.get(1) or 1.0
    for rows, seconds in sorted(verify.items()):
        table.add_row(f"verify, {rows} row{'s' if rows > 1 else ''}", f"{seconds * 1e3:.2f}", f"{seconds / one:.2f}")
    by_batch = costs.get("draft_by_batch") or {}
    for drafter, seconds in sorted(costs.get("draft", {}).items()):
        table.add_row(f"draft step, {drafter}", f"{seconds * 1e3:.2f}", f"{seconds / one:.2f}")
        for batch, s in sorted((int(b), float(s)) for b, s in (by_batch.get(drafter) or {}).items()):
            table.add_row(f"draft step, {drafter}, {batch} requests", f"{s * 1e3:.2f}", f"{s / one:.2f}")
    return table


def register(main: click.Group) -> None:
    main.add_command(status)
