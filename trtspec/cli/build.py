"""`trtspec build`."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.options import config_option, json_option, runtime_option, with_runtime


@click.command()
@config_option
@click.option("--out-engines", default="engines", show_default=True, envvar="TRTSPEC_ENGINES",
              type=click.Path(file_okay=False), help="Where engines/<name>/ are written.")
@click.option("--out-repo", default="model_repository", show_default=True, envvar="TRTSPEC_MODEL_REPOSITORY",
              type=click.Path(file_okay=False), help="Where model_repository/<name>/ is written.")
@runtime_option
@click.option("--dry-run", is_flag=True, help="Print the build plan (trtllm-build command lines); run nothing.")
@click.option("--force", is_flag=True, help="Rebuild even if the lock manifest says nothing changed.")
@click.option("--trtllm-build", "trtllm_build", envvar="TRTSPEC_TRTLLM_BUILD",
              help="Command that runs trtllm-build (e.g. a path, or 'docker run ... trtllm-build').")
@json_option
def build(config, out_engines, out_repo, runtime, dry_run, force, trtllm_build, as_json) -> None:
    """Validate the spec and model pair, write engines/<name>/ with a lock manifest, and emit
    the Triton model repository model_repository/<name>/.

    Writes are atomic: a failed build leaves the previous outputs untouched. A re-build with
    unchanged inputs whose outputs still match the lock's hashes does nothing and says so;
    otherwise it says why it rebuilds (e.g. `rebuilding: engines/<name>/target/model.safetensors changed`).
    """
    from trtspec.backends import build as run_build
    from trtspec.builders import BuildOptions
    from trtspec.check import load_spec

    spec = with_runtime(load_spec(config), runtime)
    options = BuildOptions(out_engines=Path(out_engines), out_repo=Path(out_repo), dry_run=dry_run, force=force,
                           trtllm_build=trtllm_build, progress=not as_json)
    result = run_build(spec, options)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    if result.dry_run:
        for step in result.plan:
            click.echo(f"# {step.get('role', '')}")
            click.echo(step.get("shell", " ".join(step.get("argv", []))))
        return
    if result.rebuilt and result.reason:
        click.echo(f"rebuilding: {result.reason}")
    verb = "rebuilt " + ", ".join(result.rebuilt) if result.rebuilt else "nothing to rebuild (lock unchanged)"
    click.echo(f"{verb} in {result.seconds:.2f}s")
    for role, path in result.engines.items():
        click.echo(f"  engine {role:<8} {path}")
    if result.repository:
        click.echo(f"  repository      {result.repository}")


def register(main: click.Group) -> None:
    main.add_command(build)
