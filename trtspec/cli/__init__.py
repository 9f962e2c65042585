"""The trtspec command line: thin Click commands over library functions.

Each verb lives in its own module of this package and registers itself on `main`.
Errors of the TrtspecError family are caught once, here, and printed as one line
plus a hint; see trtspec.errors.EXIT_CODES for the exit codes.
"""

from __future__ import annotations

import importlib
import os
import sys

import click

from trtspec import __version__
from trtspec.errors import EXIT_CODES, TrtspecError

EXIT_CODE_HELP = "\n".join(f"  {code:>3}  {what}" for code, what in EXIT_CODES.items())

# Modules that define commands; each exposes `register(main)`.
COMMAND_MODULES = [
    "trtspec.cli.spec_cmds",
    "trtspec.cli.models",
    "trtspec.cli.generate",
    "trtspec.cli.build",
    "trtspec.cli.serve",
    "trtspec.cli.bench",
    "trtspec.cli.convert",
    "trtspec.cli.deploy",
]


class TrtspecGroup(click.Group):
    """A group that turns TrtspecError into `error:`/`hint:` lines and an exit code."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except TrtspecError as exc:
            if ctx.find_root().params.get("debug"):
                raise
            click.secho(f"error: {exc.message}", fg="red", err=True)
            for problem in getattr(exc, "problems", [])[1:]:
                click.secho(f"error: {problem}", fg="red", err=True)
            if exc.hint:
                click.echo(f"hint: {exc.hint}", err=True)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(
    cls=TrtspecGroup,
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "TRTSPEC"},
    epilog=f"Exit codes:\n\n\b\n{EXIT_CODE_HELP}",
)
@click.version_option(__version__, prog_name="trtspec")
@click.option("--debug", is_flag=True, envvar="TRTSPEC_DEBUG", help="Show tracebacks instead of one-line errors.")
def main(debug: bool) -> None:
    """trtspec: take an LLM from Hugging Face checkpoints to a speculative-decoding
    service on NVIDIA Triton Inference Server, and prove it fast and lossless.

    \b
    Typical flow:
      trtspec init                      write a commented trtspec.toml
      trtspec check                     validate the spec and the model pair
      trtspec generate --local -p TEXT  speculative generation in-process
      trtspec build                     engines/ + model_repository/
      trtspec serve                     start Triton on the repository
      trtspec generate --url HOST:PORT  stream from the server over gRPC
      trtspec bench                     acceptance, tokens/step, speedup
    """
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(_name)
    except ModuleNotFoundError as _exc:  # a stage not written yet
        if _exc.name != _name:
            raise
        continue
    _module.register(main)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
