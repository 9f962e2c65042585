"""`trtspec serve`: run the bundled Triton server on model_repository/<name>/."""

from __future__ import annotations

import json
import signal
import threading

import click

from trtspec.cli.options import config_option, json_option, runtime_option, with_runtime
from trtspec.errors import ServeError


def _endpoint_lines(state: dict) -> list[str]:
    return [f"  gRPC     {state['grpc_url']}   (trtspec generate --url {state['grpc_url']})",
            f"  HTTP     http://{state['http_url']}/v2/models/{state.get('ensemble', 'ensemble')}/generate",
            f"  metrics  {state['metrics_url']}",
            f"  log      {state['log']}"]


@click.command()
@config_option
@click.option("--grpc-port", type=click.IntRange(0, 65535), help="gRPC port (default: serving.grpc_port; 0 = free).")
@click.option("--http-port", type=click.IntRange(0, 65535), help="HTTP port (default: serving.http_port; 0 = free).")
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Metrics port (default: serving.metrics_port; 0 = free).")
@click.option("--repo", "out_repo", default="model_repository", show_default=True, envvar="TRTSPEC_MODEL_REPOSITORY",
              type=click.Path(file_okay=False), help="Parent of the built model_repository/<name>/.")
@click.option("--foreground", is_flag=True, help="Run in this terminal until Ctrl-C / SIGTERM.")
@click.option("--stop", "stop", is_flag=True, help="Stop the background server started for this spec.")
@click.option("--timeout", default=300.0, show_default=True, type=float,
              help="Seconds to wait for the server and every model to be ready.")
@runtime_option
@click.option("--print-command", is_flag=True,
              help="trtllm runtimes: print the server command line (mpirun x world size) and exit.")
@json_option
def serve(config, grpc_port, http_port, metrics_port, out_repo, foreground, stop, timeout, runtime, print_command,
          as_json) -> None:
    """Start Triton Inference Server (the one bundled with nvidia-pytriton) on the spec's model
    repository and print its endpoints.

    By default the server runs in the background and its pid, ports and log are recorded in
    .trtspec/serve-<name>.json (what `--stop` and `trtspec generate` read). The Python-backend
    environment (backend dir, LD_LIBRARY_PATH, PATH, shared memory) is prepared automatically.

    For the trtllm-engine / trtllm-llmapi runtimes this runs inside the Triton TensorRT-LLM
    container: it installs NVIDIA's Python models into the repository and runs tritonserver under
    mpirun (world size = tensor x pipeline parallel) in the foreground. --print-command shows it.
    """
    from trtspec.serve import running_state, server_for_spec, start_background, stop_background
    from trtspec.spec import load_spec

    spec = with_runtime(load_spec(config), runtime)
    if spec.runtime.kind != "torch" and not stop:
        _serve_trtllm(spec, out_repo, grpc_port, http_port, metrics_port, print_command, as_json)
        return
    if stop:
        state = stop_background(spec.name)
        if as_json:
            click.echo(json.dumps({"stopped": state is not None, "state": state}, indent=2))
        elif state is None:
            click.echo(f"no background server recorded for {spec.name!r}")
        else:
            click.echo(f"stopped server for {spec.name!r} (pid {state['pid']})")
        return
    ports = {"grpc_port": grpc_port, "http_port": http_port, "metrics_port": metrics_port}
    if not foreground:
        state = start_background(spec, out_repo=out_repo, ready_timeout=timeout, **ports)
        if as_json:
            click.echo(json.dumps(state, indent=2))
            return
        click.echo(f"serving {spec.name!r} ({spec.method}) in the background, pid {state['pid']}")
        for line in _endpoint_lines(state):
            click.echo(line)
        click.echo(f"stop with: trtspec serve -c {config} --stop")
        return
    if running_state(spec.name):
        raise click.UsageError(f"a background server for {spec.name!r} is running; stop it with --stop first")
    server = server_for_spec(spec, out_repo=out_repo, ready_timeout=timeout, **ports)
    stop_event = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    try:
        server.start()
        state = server.state() | {"name": spec.name, "ensemble": spec.serving.ensemble_name}
        if as_json:
            click.echo(json.dumps(state, indent=2))
        else:
            click.echo(f"serving {spec.name!r} ({spec.method}), pid {server.pid}; Ctrl-C stops it")
            for line in _endpoint_lines(state):
                click.echo(line)
        while not stop_event.wait(0.5):
            if not server.is_running():
                raise click.ClickException(f"tritonserver exited; {server.failure_report()}")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        click.echo("stopping ...", err=True)
        server.stop()


def _serve_trtllm(spec, out_repo, grpc_port, http_port, metrics_port, print_command, as_json) -> None:
    """Run the launch command of a TensorRT-LLM repository (inside the Triton TRT-LLM container)."""
    import shlex
    import subprocess
    from pathlib import Path

    from trtspec.repository.trtllm import install_upstream_files, launch_command
    from trtspec.repository.trtllm.launch import TRITONSERVER

    repo = Path(out_repo) / spec.name
    cmd = launch_command(spec, repo, http_port=http_port or None, grpc_port=grpc_port or None,
                         metrics_port=metrics_port or None)
    if print_command or as_json:
        click.echo(json.dumps({"argv": cmd, "shell": shlex.join(cmd)}, indent=2) if as_json else shlex.join(cmd))
        return
    if not repo.is_dir():
        raise ServeError(f"no model repository at {repo}", hint=f"run `trtspec build -c <spec>` first")
    if not Path(TRITONSERVER).is_file():
        image = spec.runtime.trtllm.image
        raise ServeError(f"runtime {spec.runtime.kind!r} serves from the Triton TensorRT-LLM container ({TRITONSERVER} "
                         "is not here; the bundled CPU server has no tensorrtllm backend)",
                         hint=f"docker run --gpus all --shm-size 2g -v $PWD:/work -w /work {image} "
                              f"trtspec serve -c <spec>   (or --print-command to see the command)")
    install_upstream_files(repo)
    click.echo(f"serving {spec.name!r} ({spec.method}, world size {spec.world_size}): {shlex.join(cmd)}", err=True)
    raise SystemExit(subprocess.call(cmd))


def register(main: click.Group) -> None:
    main.add_command(serve)
