"""`trtspec convert`."""

from __future__ import annotations

import json

import click

from trtspec.cli.options import config_option, json_option


@click.command()
@config_option
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Write <OUT>/<role>/ (default: engines/<name>/checkpoints/<role>/).")
@click.option("--out-engines", default="engines", show_default=True, envvar="TRTSPEC_ENGINES",
              type=click.Path(file_okay=False), help="Engines root used for the default --out.")
@click.option("--tp", type=click.IntRange(1, 1024), help="Tensor parallel size (default: gpu.tensor_parallel).")
@click.option("--pp", type=click.IntRange(1, 1024), help="Pipeline parallel size (default: gpu.pipeline_parallel).")
@click.option("--force", is_flag=True, help="Convert even if the manifest says the checkpoint is up to date.")
@json_option
def convert(config, out_dir, out_engines, tp, pp, force, as_json) -> None:
    """Convert the spec's HF checkpoints to TensorRT-LLM checkpoints (config.json +
    rank<N>.safetensors per role), on CPU, without TensorRT-LLM installed.

    \b
    draft-model  target + draft  LlamaForCausalLM
    medusa       target          MedusaForCausalLM (base + heads)
    eagle        target          EagleForCausalLM (base + EAGLE-1 head)
    lookahead    target          LlamaForCausalLM

    Writes are atomic; an unchanged conversion is skipped (see trtspec.convert.json).
    """
    from pathlib import Path

    from trtspec.backends.trtllm_engine_methods import engine_method
    from trtspec.check import load_spec
    from trtspec.convert import convert as run_convert, default_out_dir

    spec = load_spec(config)
    log = None if as_json else (lambda msg: click.echo(msg, err=True))
    out = Path(out_dir) if out_dir else default_out_dir(spec, Path(out_engines))
    jobs = engine_method(spec).conversions(spec, out, tp, pp)  # the runtime's jobs for the method (its table)
    result = run_convert(jobs, out, force=force, log=log)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    for role, ck in result.checkpoints.items():
        state = "converted" if ck.converted else "up to date"
        click.echo(f"{role:<7} {ck.architecture:<18} world_size={ck.world_size}  {state:<10}  {ck.path}")
    click.echo(f"done in {result.seconds:.2f}s")


def register(main: click.Group) -> None:
    main.add_command(convert)
