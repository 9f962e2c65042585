"""The trtspec command line: thin Click commands over library functions.

Each verb lives in its own module of this package and registers itself on `main`.
Errors of the TrtspecError family are caught once, here, and printed as one line
plus a hint; see trtspec.errors.EXIT_CODES for the exit codes.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import NoReturn

import click

from trtspec import __version__
from trtspec.errors import EXIT_CODES, TrtspecError, UsageError

EXIT_CODE_HELP = "\n".join(f"  {code:>3}  {what}" for code, what in EXIT_CODES.items())

# Modules that define commands; each exposes `register(main)`.
COMMAND_MODULES = [
    "trtspec.cli.spec_cmds",
    "trtspec.cli.models",
    "trtspec.cli.train",
    "trtspec.cli.generate",
    "trtspec.cli.build",
    "trtspec.cli.serve",
    "trtspec.cli.bench",
    "trtspec.cli.convert",
    "trtspec.cli.deploy",
    "trtspec.cli.repo",
    "trtspec.cli.tune",
    "trtspec.cli.status",
    "trtspec.cli.rollback",
    "trtspec.cli.export",
]


class TrtspecGroup(click.Group):
    """A group that turns TrtspecError into `error:`/`hint:` lines and an exit code, and click's own usage
    errors (unknown option or command, a flag value out of range, options that need each other) into the
    same two lines and UsageError's exit code (64), in every command: click would print a usage block and
    exit 2, the code of a bad spec."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:  # the group's own options (`trtspec --bogus`), or no command at all
            _usage_error(ctx, exc)

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
        except click.UsageError as exc:  # a command's options, or a command that raised one
            _usage_error(ctx, exc)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


def _usage_error(ctx: click.Context, exc: click.UsageError) -> NoReturn:
    """`error: <click's message>` + `hint: <command> --help`, exit 64. A bare `trtspec` shows the help."""
    if isinstance(exc, click.exceptions.NoArgsIsHelpError):
        exc.show()
    else:
        if exc.ctx is not None:
            command = exc.ctx.command_path
        else:
            command = " ".join(filter(None, [ctx.command_path, ctx.invoked_subcommand]))
        click.secho(f"error: {' '.join(exc.format_message().split())}", fg="red", err=True)
        click.echo(f"hint: `{command} --help` shows the usage and every option", err=True)
    ctx.exit(UsageError.exit_code)


@click.group(
    "trtspec",
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
