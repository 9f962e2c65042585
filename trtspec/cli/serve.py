"""`trtspec serve`: run the deployment's Triton server (its backend's: trtspec.serve.Server) on
model_repository/<name>/, in the background or in this terminal."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.options import admin_key_option, config_option, json_option, runtime_option, with_runtime


def _warn(message: str) -> None:
    click.secho(f"warning: {message}", fg="yellow", bold=True, err=True)


def _safety_warnings(host: str, open_model_control: bool) -> None:
    from trtspec.serve.endpoints import is_loopback

    if not is_loopback(host):
        _warn(f"binding {host}: the server is reachable from other machines. Inference and metrics have no "
              "authentication; serve gRPC over TLS (--grpc-server-cert/--grpc-server-key) and put an "
              "authenticating proxy or a firewall in front.")
    if open_model_control:
        _warn("--open-model-control: anyone who reaches the server can load models, i.e. run any model.py as "
              "this user, and unload the deployment. Use it only on a trusted, private network.")


@click.command()
@config_option
@click.option("--grpc-port", type=click.IntRange(0, 65535), help="gRPC port (default: serving.grpc_port; 0 = free).")
@click.option("--http-port", type=click.IntRange(0, 65535), help="HTTP port (default: serving.http_port; 0 = free).")
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Metrics port (default: serving.metrics_port; 0 = free).")
@click.option("--host", metavar="ADDRESS",
              help="Address to bind HTTP, gRPC and metrics to (default 127.0.0.1). Anything but loopback makes "
                   "the server reachable from other machines (warned).")
@admin_key_option
@click.option("--open-model-control", is_flag=True,
              help="Leave the model-repository API (load/unload = run code) open to every client (warned).")
@click.option("--drain-timeout", default=30.0, show_default=True, type=click.FloatRange(min=0.0),
              help="On stop, seconds requests in flight may take to finish; then they end with a 'shutdown' "
                   "error. Also Triton's --exit-timeout-secs.")
@click.option("--grpc-server-cert", type=click.Path(exists=True, dir_okay=False),
              help="Serve gRPC over TLS with this PEM certificate (with --grpc-server-key).")
@click.option("--grpc-server-key", type=click.Path(exists=True, dir_okay=False), help="PEM key of --grpc-server-cert.")
@click.option("--grpc-client-ca", type=click.Path(exists=True, dir_okay=False),
              help="Mutual TLS: accept only clients with a certificate signed by this CA (PEM).")
@click.option("--repo", "out_repo", default="model_repository", show_default=True, envvar="TRTSPEC_MODEL_REPOSITORY",
              type=click.Path(file_okay=False), help="Parent of the built model_repository/<name>/.")
@click.option("--foreground", is_flag=True, help="Run in this terminal until Ctrl-C / SIGTERM (then drain and stop).")
@click.option("--stop", "stop", is_flag=True, help="Drain and stop the background server started for this spec.")
@click.option("--timeout", default=300.0, show_default=True, type=float,
              help="Seconds to wait for the server and every model to be ready.")
@runtime_option
@click.option("--print-command", is_flag=True,
              help="trtllm runtimes: print the server command line (mpirun x world size) and exit.")
@json_option
def serve(config, grpc_port, http_port, metrics_port, host, admin_key, open_model_control, drain_timeout,
          grpc_server_cert, grpc_server_key, grpc_client_ca, out_repo, foreground, stop, timeout, runtime,
          print_command, as_json) -> None:
    """Start Triton Inference Server (the one bundled with nvidia-pytriton) on the spec's model
    repository and print its endpoints.

    By default the server runs in the background, binds 127.0.0.1, and its pid, ports, log and
    admin key are recorded in .trtspec/serve-<name>.json (mode 0600; what `--stop`, `trtspec
    generate` and `trtspec deploy` read). The model-repository API (load/unload) answers only
    requests with the header `trtspec-admin-key: <key>`; the key is random per start unless
    --admin-key / $TRTSPEC_ADMIN_KEY gives one. `--stop` (and SIGTERM in --foreground) drains:
    requests in flight finish (up to --drain-timeout), new ones are refused, then the server exits.

    For the trtllm-engine / trtllm-llmapi runtimes this runs inside the Triton TensorRT-LLM
    container: it installs NVIDIA's Python models into the repository and runs tritonserver under
    mpirun (world size = tensor x pipeline parallel) in the foreground. --print-command shows it.
    """
    from trtspec import backends
    from trtspec.check import load_spec
    from trtspec.serve import ServeOptions
    from trtspec.serve.access import GrpcTls, check_admin_key
    from trtspec.serve.bundled import endpoint_lines, public
    from trtspec.serve.endpoints import check_host

    spec = with_runtime(load_spec(config), runtime)
    if stop:
        _stop(spec, as_json)
        return
    host = check_host(host or "127.0.0.1")
    if admin_key:
        check_admin_key(admin_key)
    if bool(grpc_server_cert) != bool(grpc_server_key):
        raise click.UsageError("--grpc-server-cert and --grpc-server-key go together")
    if grpc_client_ca and not grpc_server_cert:
        raise click.UsageError("--grpc-client-ca needs --grpc-server-cert/--grpc-server-key")
    tls = GrpcTls(grpc_server_cert, grpc_server_key, grpc_client_ca) if grpc_server_cert else None
    options = ServeOptions(out_repo=Path(out_repo), grpc_port=grpc_port, http_port=http_port,
                           metrics_port=metrics_port, host=host, admin_key=admin_key,
                           open_model_control=open_model_control, drain_timeout=drain_timeout, grpc_tls=tls,
                           ready_timeout=timeout)
    server = backends.for_spec(spec).server(spec, options)
    if not server.detaches and (print_command or as_json):  # a server of this terminal only: show its command
        shown = server.command()
        click.echo(json.dumps(shown, indent=2) if as_json else shown["shell"])
        return
    _safety_warnings(host, open_model_control)
    if foreground or not server.detaches:
        code = server.run(click.echo, as_json=as_json)
        if code:
            raise SystemExit(code)
        return
    state = server.start_background()
    cleaned = state.pop("cleaned", None)
    if as_json:
        click.echo(json.dumps(public(state), indent=2))
        return
    if cleaned:
        click.echo(f"cleaned up after a server that was gone: {len(cleaned['stubs'])} stub process(es), "
                   f"{len(cleaned['shm'])} shared-memory file(s)", err=True)
    click.echo(f"serving {spec.name!r} ({spec.method}) in the background, pid {state['pid']}")
    for line in endpoint_lines(state):
        click.echo(line)
    click.echo(f"stop with: trtspec serve -c {config} --stop")


def _stop(spec, as_json: bool) -> None:
    from trtspec.serve import stop_background

    state = stop_background(spec.name)
    outcome = state.get("outcome") if state else None
    if as_json:
        from trtspec.serve.bundled import public

        shown = public(state or {})
        click.echo(json.dumps({"stopped": outcome == "stopped", "outcome": outcome, "state": shown or None}, indent=2))
        return
    if state is None:
        click.echo(f"no background server recorded for {spec.name!r}")
        return
    cleaned = state.get("cleaned") or {}
    left = f"; cleaned up {len(cleaned.get('stubs', []))} stub process(es), {len(cleaned.get('shm', []))} " \
           "shared-memory file(s)" if any(cleaned.values()) else ""
    if outcome == "stopped":
        drain = state.get("drain") or {}
        how = f", drained in {drain['seconds']:.1f}s" if drain else ""
        click.echo(f"stopped server for {spec.name!r} (pid {state['pid']}{how}){left}")
    elif outcome == "pid reused":
        click.echo(f"the server recorded for {spec.name!r} is gone: pid {state['pid']} now belongs to another "
                   f"process ({state.get('pid_now') or '?'}), which was not signalled; removed the stale state{left}")
    else:
        click.echo(f"the server recorded for {spec.name!r} (pid {state.get('pid')}) was not running; "
                   f"removed the stale state{left}")


def register(main: click.Group) -> None:
    main.add_command(serve)
