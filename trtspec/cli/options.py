"""Options shared by several commands."""

from __future__ import annotations

import click

config_option = click.option(
    "-c", "--config", "config", default="trtspec.toml", show_default=True, envvar="TRTSPEC_CONFIG",
    type=click.Path(dir_okay=False), help="Deployment spec to read.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")

runtime_option = click.option("--runtime", type=click.Choice(["torch", "trtllm-engine", "trtllm-llmapi"]),
                              help="Override runtime.kind of the spec.")


def with_runtime(spec, runtime: str | None):
    """The spec with runtime.kind overridden (a GPU runtime implies device cuda, and an H100 if the spec says cpu)."""
    if not runtime or runtime == spec.runtime.kind:
        return spec
    from trtspec.spec import spec_from_dict

    data = spec.to_dict()
    data["runtime"]["kind"] = runtime
    if runtime != "torch":
        data["runtime"]["device"] = "cuda"
        if data["gpu"]["type"] == "cpu":
            data["gpu"]["type"] = "h100"
    return spec_from_dict(data, source=spec.source)
