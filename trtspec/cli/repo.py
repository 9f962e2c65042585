"""`trtspec repo relocate|bundle|install-upstream` and `trtspec cache key`: the TensorRT-LLM repository helpers
CI templates and the serving image run (ci/), inside the Triton TRT-LLM container or on a CPU runner."""

from __future__ import annotations

from pathlib import Path

import click

from trtspec.cli.options import config_option


@click.group()
def repo() -> None:
    """Work on an emitted trtllm model repository (serving images, the TRT-LLM container)."""


@repo.command()
@click.argument("repo_dir", metavar="REPO", type=click.Path(file_okay=False, path_type=Path))
@click.option("--engines", metavar="DIR", help="Engines dir holding target/ (and draft/), as engines/<name>/.")
@click.option("--tokenizer", metavar="DIR", help="Tokenizer dir the pre/postprocessing models read.")
@click.option("--checkpoints-from", metavar="PREFIX", help="llmapi: a checkpoint path prefix in model.yaml ...")
@click.option("--checkpoints-to", metavar="PREFIX", help="... and what it becomes.")
def relocate(repo_dir: Path, engines: str | None, tokenizer: str | None, checkpoints_from: str | None,
             checkpoints_to: str | None) -> None:
    """Point REPO (model_repository/<name>) at engines, tokenizer and checkpoints in another place (a serving
    image, another machine); the configs are edited through their protobuf, never as text."""
    from trtspec.repository.trtllm.relocate import relocate_repository

    ck = (checkpoints_from, checkpoints_to) if checkpoints_from and checkpoints_to else None
    for path in relocate_repository(repo_dir, engines=engines, tokenizer=tokenizer, checkpoints=ck):
        click.echo(f"updated {path}")


@repo.command()
@config_option
@click.option("--out", default="bundle", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="The build context to write (a new or empty dir, or a previous bundle).")
@click.option("--out-engines", default="engines", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Parent of the built engines/<name>/.")
@click.option("--out-repo", default="model_repository", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="Parent of the built model_repository/<name>/.")
@click.option("--image-root", default="/opt/trtspec", show_default=True, help="Where the bundle lies in the image.")
def bundle(config: str, out: Path, out_engines: Path, out_repo: Path, image_root: str) -> None:
    """Assemble the docker build context of the serving image (ci/Dockerfile): engines or checkpoints,
    tokenizer, the repository re-pointed at them, launch.sh, bundle.json."""
    from trtspec.backends.bundle import bundle as make_bundle
    from trtspec.check import load_spec

    path = make_bundle(load_spec(config), out, engines_root=out_engines, repo_root=out_repo, image_root=image_root)
    click.echo(f"bundle written to {path}")


@repo.command("install-upstream")
@click.argument("repo_dir", metavar="REPO", type=click.Path(file_okay=False, path_type=Path))
@click.option("--from", "source", default="/app/all_models", show_default=True, metavar="DIR",
              help="The container's all_models dir.")
@click.option("--overwrite", is_flag=True, help="Copy files that are already there too.")
def install_upstream(repo_dir: Path, source: str, overwrite: bool) -> None:
    """Copy NVIDIA's python model.py files (and helpers) REPO needs from the Triton TensorRT-LLM container
    (trtspec ships none of them); nothing is copied unless every one is there."""
    from trtspec.repository.trtllm.upstream import install_upstream_files

    for path in install_upstream_files(repo_dir, source, overwrite):
        click.echo(f"copied {path}")


@click.group()
def cache() -> None:
    """Engine cache keys for CI (trtllm-engine)."""


@cache.command()
@config_option
@click.option("--out-engines", default="engines", show_default=True, type=click.Path(file_okay=False, path_type=Path),
              help="Parent of engines/<name>/ (its converted checkpoints).")
def key(config: str, out_engines: Path) -> None:
    """Print `name=<name>` and `engine_key=<sha256 over every engine's key>` (dotenv / $GITHUB_OUTPUT lines)
    for a spec whose checkpoints are converted (`trtspec convert`; CPU only)."""
    from trtspec.artifacts.fs import digest
    from trtspec.backends.trtllm_engine_methods import engine_method
    from trtspec.builders.trtllm.engine_cache import spec_engine_keys
    from trtspec.check import load_spec
    from trtspec.errors import BuildError

    spec = load_spec(config)
    try:
        keys = spec_engine_keys(spec, engine_method(spec), out_engines)
    except FileNotFoundError as exc:
        raise BuildError(str(exc), hint=f"trtspec convert -c {config}") from None
    click.echo(f"name={spec.name}")
    click.echo(f"engine_key={digest(keys)}")


def register(main: click.Group) -> None:
    main.add_command(repo)
    main.add_command(cache)
