"""Options shared by several commands."""

from __future__ import annotations

import click

config_option = click.option(
    "-c", "--config", "config", default="trtspec.toml", show_default=True, envvar="TRTSPEC_CONFIG",
    type=click.Path(dir_okay=False), help="Deployment spec to read.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
