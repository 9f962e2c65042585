"""`trtspec serve`: run the bundled Triton server on model_repository/<name>/."""

from __future__ import annotations

import json
import signal
import threading

import click

from trtspec.cli.options import admin_key_option, config_option, json_option, runtime_option, with_runtime
from trtspec.errors import ServeError


def _endpoint_lines(state: dict, where: str = "the key is in the state file") -> list[str]:
    grpc = ("grpcs://" if state.get("grpc_tls") else "") + state["grpc_url"]
    control = ("OPEN (--open-model-control)" if state.get("model_control_open")
               else f"restricted to the admin key (header trtspec-admin-key; {where})")
    return [f"  gRPC     {grpc}   (trtspec generate --url {grpc})",
            f"  HTTP     http://{state['http_url']}/v2/models/{state.get('ensemble', 'ensemble')}/generate",
            f"  metrics  {state['metrics_url']}",
            f"  models   {state.get('model_control', 'explicit')} control, {control}",
            f"  log      {state['log']}"]


def _warn(message: str) -> None:
    click.secho(f"warning: {message}", fg="yellow", bold=True, err=True)


def _safety_warnings(host: str, open_model_control: bool) -> None:
    from trtspec.serve.server import is_loopback

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
    from trtspec.serve import running_state, server_for_spec, start_background, stop_background
    from trtspec.serve.server import GrpcTls, check_admin_key, check_host
    from trtspec.spec import load_spec

    spec = with_runtime(load_spec(config), runtime)
    if stop:
        _stop(spec, as_json)
        return
    host = check_host(host or "127.0.0.1")
    if admin_key:
        check_admin_key(admin_key)
    if spec.runtime.kind != "torch":
        _serve_trtllm(spec, out_repo, grpc_port, http_port, metrics_port, host, admin_key, open_model_control,
                      print_command, as_json)
        return
    if bool(grpc_server_cert) != bool(grpc_server_key):
        raise click.UsageError("--grpc-server-cert and --grpc-server-key go together")
    if grpc_client_ca and not grpc_server_cert:
        raise click.UsageError("--grpc-client-ca needs --grpc-server-cert/--grpc-server-key")
    tls = GrpcTls(grpc_server_cert, grpc_server_key, grpc_client_ca) if grpc_server_cert else None
    _safety_warnings(host, open_model_control)
    kwargs = {"grpc_port": grpc_port, "http_port": http_port, "metrics_port": metrics_port, "host": host,
              "admin_key": admin_key, "open_model_control": open_model_control, "drain_timeout": drain_timeout,
              "grpc_tls": tls}
    if not foreground:
        state = start_background(spec, out_repo=out_repo, ready_timeout=timeout, **kwargs)
        cleaned = state.pop("cleaned", None)
        if as_json:
            click.echo(json.dumps({k: v for k, v in state.items() if k not in ("admin_key", "cmdline")}, indent=2))
            return
        if cleaned:
            click.echo(f"cleaned up after a server that was gone: {len(cleaned['stubs'])} stub process(es), "
                       f"{len(cleaned['shm'])} shared-memory file(s)", err=True)
        click.echo(f"serving {spec.name!r} ({spec.method}) in the background, pid {state['pid']}")
        for line in _endpoint_lines(state):
            click.echo(line)
        click.echo(f"stop with: trtspec serve -c {config} --stop")
        return
    if running_state(spec.name):
        raise ServeError(f"a background server for {spec.name!r} is running",
                         hint=f"stop it with `trtspec serve -c {config} --stop` first")
    server = server_for_spec(spec, out_repo=out_repo, ready_timeout=timeout, **kwargs)
    stop_event = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    try:
        server.start()
        state = server.state() | {"name": spec.name, "ensemble": spec.serving.ensemble_name}
        if as_json:
            click.echo(json.dumps({k: v for k, v in state.items() if k not in ("admin_key", "cmdline")}, indent=2))
        else:
            click.echo(f"serving {spec.name!r} ({spec.method}), pid {server.pid}; Ctrl-C stops it")
            where = "the --admin-key given" if admin_key else "a random key: pass --admin-key to choose one"
            for line in _endpoint_lines(state, where):
                click.echo(line)
        while not stop_event.wait(0.5):
            if not server.is_running():
                raise ServeError(f"tritonserver exited; {server.failure_report()}",
                                 hint=f"full log: {server.log_path}")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        click.echo(f"draining (up to {drain_timeout:g}s) and stopping ...", err=True)
        server.stop()


def _stop(spec, as_json: bool) -> None:
    from trtspec.serve import stop_background

    state = stop_background(spec.name)
    outcome = state.get("outcome") if state else None
    if as_json:
        public = {k: v for k, v in (state or {}).items() if k not in ("admin_key", "cmdline")}
        click.echo(json.dumps({"stopped": outcome == "stopped", "outcome": outcome, "state": public or None}, indent=2))
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


def _serve_trtllm(spec, out_repo, grpc_port, http_port, metrics_port, host, admin_key, open_model_control,
                  print_command, as_json) -> None:
    """Run the launch command of a TensorRT-LLM repository (inside the Triton TRT-LLM container)."""
    import shlex
    import subprocess
    from pathlib import Path

    from trtspec.repository.trtllm import install_upstream_files, launch_command
    from trtspec.repository.trtllm.launch import ADMIN_KEY_REF, TRITONSERVER, launch_shell

    repo = Path(out_repo) / spec.name
    ports = {"http_port": http_port or None, "grpc_port": grpc_port or None, "metrics_port": metrics_port or None}
    if print_command or as_json:  # the key never printed: the command reads it from $TRTSPEC_ADMIN_KEY
        cmd = launch_command(spec, repo, host=host, admin_key=None if open_model_control else ADMIN_KEY_REF, **ports)
        shell = launch_shell(cmd)
        click.echo(json.dumps({"argv": cmd, "shell": shell}, indent=2) if as_json else shell)
        return
    if not repo.is_dir():
        raise ServeError(f"no model repository at {repo}", hint=f"run `trtspec build -c <spec>` first")
    if not Path(TRITONSERVER).is_file():
        image = spec.runtime.trtllm.image
        raise ServeError(f"runtime {spec.runtime.kind!r} serves from the Triton TensorRT-LLM container ({TRITONSERVER} "
                         "is not here; the bundled CPU server has no tensorrtllm backend)",
                         hint=f"docker run --gpus all --shm-size 2g -v $PWD:/work -w /work {image} "
                              f"trtspec serve -c <spec>   (or --print-command to see the command)")
    from trtspec.serve.server import new_admin_key

    _safety_warnings(host, open_model_control)
    key = None if open_model_control else admin_key or new_admin_key()
    cmd = launch_command(spec, repo, host=host, admin_key=key, **ports)
    install_upstream_files(repo)
    shown = [a.replace(key, "***") for a in cmd] if key else cmd
    click.echo(f"serving {spec.name!r} ({spec.method}, world size {spec.world_size}): {shlex.join(shown)}", err=True)
    raise SystemExit(subprocess.call(cmd))


def register(main: click.Group) -> None:
    main.add_command(serve)
