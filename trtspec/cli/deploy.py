"""`trtspec deploy`: put a built deployment onto a running Triton server without an outage (the new
version is loaded and smoke-tested beside the serving one, then switched to), roll back on failure."""

from __future__ import annotations

import json

import click

from trtspec.cli.options import admin_key_option, config_option, grpc_client_options, json_option


@click.command()
@config_option
@click.option("--url", envvar="TRTSPEC_HTTP_URL", metavar="HOST:HTTP_PORT",
              help="HTTP endpoint of the running server (explicit model-control mode); required but with --tidy.")
@click.option("--server-repo", required=True, envvar="TRTSPEC_SERVER_REPO",
              type=click.Path(file_okay=False), help="The model repository directory DIR that server reads (a "
              "local path, or a directory inside a mounted volume): the models are copied into it, the engines, "
              "backups and lock go beside it into DIR.trtspec/.")
@click.option("--grpc-url", envvar="TRTSPEC_URL", metavar="HOST:GRPC_PORT",
              help="gRPC endpoint for the smoke test (default: the HTTP host with the gRPC port recorded by "
                   "`trtspec serve` for that server).")
@click.option("--repo", "out_repo", default="model_repository", show_default=True, envvar="TRTSPEC_MODEL_REPOSITORY",
              type=click.Path(file_okay=False), help="Parent of the built model_repository/<name>/.")
@click.option("--engines", "out_engines", default="engines", show_default=True, envvar="TRTSPEC_ENGINES",
              type=click.Path(file_okay=False), help="Parent of the built engines/<name>/.")
@click.option("--smoke-prompt", default="def main():\n    ", show_default=True,
              help="Prompt of the greedy smoke test (with and without speculation; outputs must match).")
@click.option("--smoke-tokens", default=32, show_default=True, type=click.IntRange(min=1),
              help="Tokens to generate in the smoke test.")
@click.option("--no-rollback", is_flag=True, help="On failure leave the new files and models (or the failed "
              "candidate) as they are.")
@click.option("--no-candidate", is_flag=True, help="Replace the serving version in place: unload it, then load the "
              "new one (requests fail until it is loaded), for a server without memory for a second copy.")
@click.option("--timeout", default=300.0, show_default=True, type=float,
              help="Seconds for model (un)loading and for each smoke request.")
@click.option("--keep-backups", default=3, show_default=True, type=click.IntRange(min=1), metavar="N",
              help="Backup dirs kept in DIR.trtspec/backups/ after a successful deploy, newest first; at least 1: "
                   "`trtspec rollback` restores the newest.")
@click.option("--tidy", is_flag=True, help="Only move what an older trtspec left inside --server-repo "
              "(.trtspec-engines/, .trtspec-backup-*/, .trtspec-stage-*/, its lock, a dead deploy's candidates) to "
              "DIR.trtspec/ beside it, then exit. Needs no server and no build.")
@admin_key_option
@grpc_client_options
@json_option
def deploy(config, url, server_repo, grpc_url, out_repo, out_engines, smoke_prompt, smoke_tokens, no_rollback,
           no_candidate, timeout, keep_backups, tidy, admin_key, as_json, grpc_options) -> None:
    """Deploy the spec's build (`trtspec build`) onto an already running Triton server, without an outage.

    Copies model_repository/<name>/ into --server-repo DIR and engines/<name>/ beside it into
    DIR.trtspec/engines/ (Triton takes every directory in DIR for a model, so nothing else of trtspec's
    goes there; DIR must not be a mount point itself: mount its parent). While the deployment serves,
    the new version is loaded beside it under candidate names (<model>__trtspec_next) and
    smoke-tested over gRPC: a greedy request with and without speculation, outputs identical. Then
    the candidate is unloaded and the serving models switch to the new files (Triton loads each new
    instance beside the old one, which finishes its requests); the previous files go to
    DIR.trtspec/backups/<time>/. A failed candidate is removed without touching the serving
    version; a failed switch restores the backup (unless --no-rollback); exit 5.

    Memory: the generation model is loaded twice during a deploy (the serving and the new version).
    --no-candidate (and a first deploy) unloads the deployment first instead: one copy, but requests
    fail until the new version is loaded.

    Model control needs the server's admin key (header trtspec-admin-key): --admin-key /
    $TRTSPEC_ADMIN_KEY, by default the key `trtspec serve` recorded for the server on that port.
    The TLS/header options apply to the gRPC smoke test.
    """
    from trtspec import backends
    from trtspec.check import load_spec
    from trtspec.serve import admin_key_for

    if tidy:
        _tidy(server_repo, as_json)
        return
    if not url:
        raise click.UsageError("Missing option '--url' (HOST:HTTP_PORT of the running server).")
    spec = load_spec(config)
    result = backends.for_spec(spec).deploy(
        spec, url, server_repo, grpc_url=grpc_url, smoke_prompt=smoke_prompt, smoke_tokens=smoke_tokens,
        rollback=not no_rollback, candidate=not no_candidate, out_repo=out_repo, out_engines=out_engines,
        timeout=timeout, admin_key=admin_key or admin_key_for(url), grpc_options=grpc_options,
        keep_backups=keep_backups, warn=warn)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    how = ("smoke-tested beside the serving version, then switched to" if result.strategy == "candidate"
           else "loaded in place")
    click.echo(f"deployed {spec.name!r} to {result.url} in {result.seconds:.1f}s ({how}): "
               f"{', '.join(result.models)} ready")
    s = result.smoke
    if s is not None:
        ttft = f"{s.ttft_seconds * 1000:.0f} ms" if s.ttft_seconds is not None else "n/a"
        tps = f", {s.tokens_per_step:.2f} tokens/step" if s.tokens_per_step else ""
        click.echo(f"  smoke    {s.new_tokens} tokens, identical to plain decoding; TTFT {ttft}, "
                   f"acceptance {s.acceptance_rate:.2f}{tps} (gRPC {result.grpc_url})")
    click.echo(f"  engines  {result.engine_dir}")
    click.echo(f"  backup   {result.backup or '(nothing replaced)'}")


def warn(message: str) -> None:
    """The one warning line of a deploy or rollback that moved an older trtspec's state out of the repository."""
    click.secho(f"warning: {message}", fg="yellow", err=True)


def _tidy(server_repo: str, as_json: bool) -> None:
    from trtspec.serve.deploy import migration_note, tidy

    layout, done = tidy(server_repo)
    if as_json:
        click.echo(json.dumps({"server_repo": str(layout.repo), "state": str(layout.state), "moved": done}, indent=2))
    elif done:
        warn(migration_note(layout, done))
    else:
        click.echo(f"nothing to tidy in {layout.repo}: its deploy state is in {layout.state}")


def register(main: click.Group) -> None:
    main.add_command(deploy)
