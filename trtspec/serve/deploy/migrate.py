"""Moving what an older trtspec left inside a server repository to its place beside it (layout.py).

Before, a deploy kept `.trtspec-engines/<name>/`, `.trtspec-backup-<rev>/`, `.trtspec-stage-<rev>/` and
`.trtspec-deploy.lock` inside DIR, where Triton takes each directory for a model. Every deploy and rollback
runs `migrate` first, under the deploy lock; `trtspec deploy --tidy` runs only it. Engines and backups move by
rename, then every config that names the old engine place is rewritten (atomically) to name the new one, so
a migration cut short is finished by the next one. Deploy records written before keep working: rollback
finds a moved backup through `Layout.legacy_backup`.
"""

from __future__ import annotations

import os
from pathlib import Path

from trtspec.errors import DeployError, RepositoryError
from trtspec.serve.deploy.layout import (
    CANDIDATE_SUFFIX,
    ENGINES_SUBDIR,
    LEGACY_BACKUP_PREFIX,
    LEGACY_LOCK_FILE,
    LEGACY_STAGE_PREFIX,
    Layout,
    _deploy_lock,
    _remove,
    prepare,
    server_layout,
)


def migrate(layout: Layout, *, candidates: bool = False) -> list[str]:
    """Move an older trtspec's deploy state out of DIR (call it holding the deploy lock); returns what was
    done, one phrase each. `candidates`: remove a dead deploy's candidate model dirs too (a deploy unloads
    them first itself)."""
    repo, done = layout.repo, []
    old_engines = repo / ENGINES_SUBDIR
    if old_engines.is_dir() and not old_engines.is_symlink():
        for engine in sorted(old_engines.iterdir()):
            _move(engine, layout.engines / engine.name, layout, done)
        _remove(old_engines)
    for old in sorted(repo.glob(f"{LEGACY_BACKUP_PREFIX}*")):
        if old.is_dir() and not old.is_symlink():
            _move(old, layout.backup(old.name[len(LEGACY_BACKUP_PREFIX):]), layout, done)
    dead = sorted(repo.glob(f"{LEGACY_STAGE_PREFIX}*"))
    dead += sorted(p for p in repo.glob(f"*{CANDIDATE_SUFFIX}") if p.is_dir()) if candidates else []
    for path in dead:
        _remove(path)
        done.append(f"removed {path.name}/ (a deploy's that did not finish)")
    if (repo / LEGACY_LOCK_FILE).is_file():
        (repo / LEGACY_LOCK_FILE).unlink()
        done.append(f"removed {LEGACY_LOCK_FILE}")
    roots = [repo, *sorted(p for p in layout.backups.iterdir() if p.is_dir())] if layout.backups.is_dir() else [repo]
    repointed = sum(_repoint(model, layout) for root in roots for model in sorted(root.iterdir()) if model.is_dir())
    if repointed:
        done.append(f"engine_dir of {repointed} config(s) now {layout.engine_param('<name>')}")
    return done


def migration_note(layout: Layout, done: list[str]) -> str:
    """The one warning line for what `migrate` did."""
    return (f"moved what an older trtspec left inside {layout.repo} (Triton takes every directory there for a "
            f"model) to {layout.state}: {'; '.join(done)}")


def tidy(server_repo: str | Path) -> tuple[Layout, list[str]]:
    """`trtspec deploy --tidy`: only the migration (no server needed); (layout, what was done)."""
    layout = server_layout(server_repo)
    prepare(layout)
    with _deploy_lock(layout):
        return layout, migrate(layout, candidates=True)


def _move(src: Path, dest: Path, layout: Layout, done: list[str]) -> None:
    if dest.exists() or dest.is_symlink():
        raise DeployError(f"cannot move {src} to {dest}: both exist (an older and a newer trtspec deployed here)",
                          hint=f"keep the one the models' engine_dir names, remove the other, run `trtspec deploy "
                               f"--tidy --server-repo {src.parent}` again")
    os.replace(src, dest)
    done.append(f"{src.relative_to(layout.repo)}/ -> {dest.relative_to(layout.repo.parent)}/")


def _repoint(model_dir: Path, layout: Layout) -> bool:
    """A config whose engine_dir is the old `.trtspec-engines/<name>` names the new place (atomic write)."""
    from trtspec.repository import pbtxt

    path = model_dir / "config.pbtxt"
    if not path.is_file() or model_dir.name == ENGINES_SUBDIR:
        return False
    try:
        config = pbtxt.read_config(path)
    except RepositoryError:  # not a model of trtspec's: leave it
        return False
    old = config.parameters["engine_dir"].string_value if "engine_dir" in config.parameters else ""
    if not old.startswith(f"{ENGINES_SUBDIR}/"):
        return False
    config.parameters["engine_dir"].string_value = layout.engine_param(old[len(ENGINES_SUBDIR) + 1:])
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(pbtxt.to_text(config), encoding="utf-8")
    os.replace(tmp, path)
    return True
