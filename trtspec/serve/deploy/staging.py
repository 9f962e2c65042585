"""Staging a build beside the server repository, and the file swaps that put it in (and take it back out)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from trtspec.serve.control import REVISION_PARAM
from trtspec.serve.deploy.layout import ENGINES_SUBDIR, Layout, _stamp, candidate_name


def _rewrite_config(model_dir: Path, engine_param: str, revision: str, rename: dict[str, str] | None = None) -> None:
    """Point the model at its engine dir and stamp the revision (a changed config: Triton reloads it);
    with `rename` (a candidate) the model takes its dir's name and the ensemble's steps are renamed."""
    from trtspec.repository import pbtxt

    config = pbtxt.read_config(model_dir / "config.pbtxt")
    if "engine_dir" in config.parameters:
        config.parameters["engine_dir"].string_value = engine_param
    config.parameters[REVISION_PARAM].string_value = revision
    if rename:
        config.name = model_dir.name
        for step in config.ensemble_scheduling.step:
            step.model_name = rename.get(step.model_name, step.model_name)
    pbtxt.write_config(model_dir, config)


@dataclasses.dataclass
class _Stage:
    path: Path                         # DIR.trtspec/stage/<rev>/
    items: list[str]                   # what goes in under the serving names (model dirs, then the engine dir)
    candidates: list[str]              # candidate model dirs (empty: in place), ensemble first


def _stage(repo_dir: Path, engine_dir: Path, models: list[str], layout: Layout, name: str, revision: str,
           candidates: bool) -> _Stage:
    """Copy the build into a stage dir beside the server repository (and its candidate models, when asked)."""
    stage = layout.stage(revision)
    engine_rel = f"{ENGINES_SUBDIR}/{name}"
    rename = {m: candidate_name(m) for m in models} if candidates else {}
    try:
        for model in models:
            shutil.copytree(repo_dir / model, stage / model)
            _rewrite_config(stage / model, layout.engine_param(name), revision)
            if candidates:
                shutil.copytree(repo_dir / model, stage / rename[model])
                _rewrite_config(stage / rename[model], layout.engine_param(name, revision), revision, rename)
        shutil.copytree(engine_dir, stage / engine_rel)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return _Stage(stage, models + [engine_rel], [rename[m] for m in models] if candidates else [])


@dataclasses.dataclass
class _Swap:
    layout: Layout
    backup: Path                       # DIR.trtspec/backups/<rev>/
    done: list[tuple[str, bool]] = dataclasses.field(default_factory=list)  # (rel path, had a previous one)

    def swap_in(self, stage: Path, items: list[str]) -> None:
        for rel in items:
            final = self.layout.final(rel)
            final.parent.mkdir(parents=True, exist_ok=True)
            had = final.exists() or final.is_symlink()
            if had:
                (self.backup / rel).parent.mkdir(parents=True, exist_ok=True)
                os.replace(final, self.backup / rel)
            self.done.append((rel, had))
            os.replace(stage / rel, final)

    def restore(self) -> None:
        for rel, had in reversed(self.done):
            final = self.layout.final(rel)
            if final.exists() or final.is_symlink():
                trash = self.layout.stages / f"trash-{_stamp()}"
                os.replace(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
            if had:
                os.replace(self.backup / rel, final)
        self.done.clear()
        shutil.rmtree(self.backup, ignore_errors=True)

    @property
    def replaced(self) -> list[str]:
        return [rel for rel, had in self.done if had]
