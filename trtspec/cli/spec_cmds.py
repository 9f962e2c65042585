"""`trtspec init` and `trtspec check`."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import click

from trtspec.cli.options import config_option, json_option
from trtspec.errors import SpecError


@click.command()
@click.argument("path", default="trtspec.toml", type=click.Path(dir_okay=False))
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(path: str, force: bool) -> None:
    """Write a commented example spec to PATH (default ./trtspec.toml)."""
    target = Path(path)
    if target.exists() and not force:
        raise SpecError(f"{target} already exists", hint="pass --force to overwrite it")
    text = resources.files("trtspec").joinpath("spec_template.toml").read_text(encoding="utf-8")
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
    click.echo(f"wrote {target}; edit it, then run `trtspec check -c {target}`")


@click.command()
@config_option
@json_option
@click.option("--no-models", is_flag=True, help="Validate the spec only; do not open the checkpoints.")
@click.option("--engines", default="engines", show_default=True, envvar="TRTSPEC_ENGINES",
              type=click.Path(file_okay=False), help="Where built engines are (trtllm-engine version check).")
@click.option("--server-trtllm-version", envvar="TRTSPEC_SERVER_TRTLLM_VERSION",
              help="TensorRT-LLM version of the serving container (default: runtime.trtllm.version); "
                   "engines built with another version are refused.")
def check(config: str, as_json: bool, no_models: bool, engines: str, server_trtllm_version: str | None) -> None:
    """Validate the spec and (unless --no-models) the model pair.

    Exits non-zero with every problem listed, one per line, each naming the key and the fix:
    2 for spec problems (keys, paths), 3 for the models and their pair, 4 for built engines.
    For the TensorRT-LLM runtimes it also prints the GPU memory plan (weights + KV cache per
    model) and refuses engines built with a TensorRT-LLM version other than the server's.
    """
    from trtspec.check import load_spec, run_check

    try:
        report = run_check(load_spec(config), models=not no_models, engines=Path(engines),
                           server_version=server_trtllm_version)
    except SpecError as exc:
        if as_json:
            click.echo(json.dumps({"ok": False, "problems": exc.problems or [exc.message]}, indent=2))
            raise SystemExit(exc.exit_code)
        raise
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
    else:
        for line in report.lines():
            click.echo(line)
    if not report.ok:
        raise report.exception()


def register(main: click.Group) -> None:
    main.add_command(init)
    main.add_command(check)
