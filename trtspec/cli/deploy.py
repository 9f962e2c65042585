"""`trtspec deploy`: put a built deployment onto a running Triton server, smoke-test it, roll back on failure."""

from __future__ import annotations

import json

import click

from trtspec.cli.options import admin_key_option, config_option, grpc_client_options, json_option


@click.command()
@config_option
@click.option("--url", required=True, envvar="TRTSPEC_HTTP_URL", metavar="HOST:HTTP_PORT",
              help="HTTP endpoint of the running server (explicit model-control mode).")
@click.option("--server-repo", required=True, envvar="TRTSPEC_SERVER_REPO",
              type=click.Path(file_okay=False), help="The model repository directory that server reads "
              "(local path or mounted volume); the models and engines are copied into it.")
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
@click.option("--no-rollback", is_flag=True, help="On failure leave the new files and models as they are.")
@click.option("--timeout", default=300.0, show_default=True, type=float,
              help="Seconds for model (un)loading and for each smoke request.")
@admin_key_option
@grpc_client_options
@json_option
def deploy(config, url, server_repo, grpc_url, out_repo, out_engines, smoke_prompt, smoke_tokens, no_rollback,
           timeout, admin_key, as_json, grpc_options) -> None:
    """Deploy the spec's build (`trtspec build`) onto an already running Triton server.

    Copies model_repository/<name>/ and engines/<name>/ into --server-repo (the previous versions go to
    a .trtspec-backup-<time>/ dir there), unloads the deployment's models, loads its ensemble, then
    runs a greedy smoke request over gRPC with and without speculation (outputs must be identical).
    On failure it restores the backup and reloads the previous models (unless --no-rollback); exit 5.

    Model control needs the server's admin key (header trtspec-admin-key): --admin-key /
    $TRTSPEC_ADMIN_KEY, by default the key `trtspec serve` recorded for the server on that port.
    The TLS/header options apply to the gRPC smoke test.
    """
    from trtspec.serve import admin_key_for
    from trtspec.serve.deploy import deploy_spec
    from trtspec.spec import load_spec

    spec = load_spec(config)
    result = deploy_spec(spec, url, server_repo, grpc_url=grpc_url, smoke_prompt=smoke_prompt,
                         smoke_tokens=smoke_tokens, rollback=not no_rollback, out_repo=out_repo,
                         out_engines=out_engines, timeout=timeout, admin_key=admin_key or admin_key_for(url),
                         grpc_options=grpc_options)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo(f"deployed {spec.name!r} to {result.url} in {result.seconds:.1f}s: {', '.join(result.models)} ready")
    s = result.smoke
    if s is not None:
        ttft = f"{s.ttft_seconds * 1000:.0f} ms" if s.ttft_seconds is not None else "n/a"
        tps = f", {s.tokens_per_step:.2f} tokens/step" if s.tokens_per_step else ""
        click.echo(f"  smoke    {s.new_tokens} tokens, identical to plain decoding; TTFT {ttft}, "
                   f"acceptance {s.acceptance_rate:.2f}{tps} (gRPC {result.grpc_url})")
    click.echo(f"  engines  {result.engine_dir}")
    click.echo(f"  backup   {result.backup or '(nothing replaced)'}")


def register(main: click.Group) -> None:
    main.add_command(deploy)
