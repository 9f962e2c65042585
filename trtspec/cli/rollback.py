"""`trtspec rollback`: put the previous deployment back on a running server (from `deploy`'s records)."""

from __future__ import annotations

import json

import click

from trtspec.cli.options import admin_key_option, config_option, grpc_client_options, json_option


@click.command()
@config_option
@click.option("--url", required=True, envvar="TRTSPEC_HTTP_URL", metavar="HOST:HTTP_PORT",
              help="HTTP endpoint of the running server (explicit model-control mode).")
@click.option("--server-repo", required=True, envvar="TRTSPEC_SERVER_REPO", type=click.Path(file_okay=False),
              help="The model repository directory that server reads (as given to `trtspec deploy`).")
@click.option("--grpc-url", envvar="TRTSPEC_URL", metavar="HOST:GRPC_PORT", help="gRPC endpoint for the smoke test.")
@click.option("--engines", "out_engines", default="engines", show_default=True, envvar="TRTSPEC_ENGINES",
              type=click.Path(file_okay=False), help="Parent of engines/<name>/ (the records are in "
              "<engines>/.deployments/<name>/).")
@click.option("--list", "list_records", is_flag=True, help="List the deployment records and exit.")
@click.option("--timeout", default=300.0, show_default=True, type=float)
@admin_key_option
@grpc_client_options
@json_option
def rollback(config, url, server_repo, grpc_url, out_engines, list_records, timeout, admin_key, as_json,
             grpc_options) -> None:
    """Roll back to the version before the newest deploy: its backup goes back under the serving names
    (what served is kept in a new backup), each model reloads beside its running instance (no outage),
    and a greedy smoke request must match plain decoding. Refused when the server does not serve what the
    newest record deployed. Run again to go one more record back (while its backup is kept: `deploy`
    keeps the newest 3).

    \b
    Example:
      trtspec rollback -c trtspec.toml --url localhost:8000 --server-repo /srv/models
    """
    from trtspec.check import load_spec
    from trtspec.cli.deploy import warn
    from trtspec.serve import admin_key_for
    from trtspec.serve.deploy import read_records, rollback_spec

    spec = load_spec(config)
    if list_records:
        from pathlib import Path

        rows = [{k: r.get(k) for k in ("revision", "kind", "time", "strategy", "backup", "rolled_back")}
                for r in read_records(Path(out_engines), spec.name, Path(server_repo))]
        if as_json:
            click.echo(json.dumps(rows, indent=2))
        elif not rows:
            click.echo(f"no deploy records of {spec.name!r} for {Path(server_repo).resolve()}")
        for r in [] if as_json else rows:
            flag = f"  rolled back by {r['rolled_back']}" if r.get("rolled_back") else ""
            click.echo(f"{r['revision']}  {r['kind']:<8} {r['time']}  backup {r['backup'] or '-'}{flag}")
        return
    result = rollback_spec(spec, url, server_repo, grpc_url=grpc_url, out_engines=out_engines, timeout=timeout,
                           admin_key=admin_key or admin_key_for(url), grpc_options=grpc_options, warn=warn)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo(f"rolled back {spec.name!r} on {result.url} in {result.seconds:.1f}s: revision "
               f"{result.from_revision} -> {result.to_revision}; {', '.join(result.models)} ready")
    if result.smoke:
        click.echo(f"  smoke    {result.smoke.new_tokens} tokens, identical to plain decoding")
    click.echo(f"  kept     {result.backup} (what served before)")


def register(main: click.Group) -> None:
    main.add_command(rollback)
