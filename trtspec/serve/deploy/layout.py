"""Where a deploy keeps its state: beside the server repository, never inside it.

Triton takes every subdirectory of a model repository for a model, hidden ones included: the repository
poll lists every entry but "." and ".." (triton-inference-server/core, branch r24.10,
src/filesystem/implementations/local.h `GetDirectorySubdirs`, used by `Poll` in
src/model_repository_manager/model_repository_manager.cc). A server that loads its whole repository at
start (model control `none` or `poll`, or `explicit` with `--load-model=*`) fails to start on a directory
that is no model. So for the server repository DIR a deploy keeps its state in the sibling `DIR.trtspec/`:

    DIR/<model>/                   the models and nothing else (candidates `<model>__trtspec_next` only while
                                   a deploy runs)
    DIR.trtspec/deploy.lock        one deploy or rollback per repository at a time
    DIR.trtspec/engines/<name>/    the engine the models read: engine_dir = "../DIR.trtspec/engines/<name>"
    DIR.trtspec/stage/<rev>/       the build being deployed: model dirs, candidates, .trtspec-engines/<name>/
    DIR.trtspec/backups/<rev>/     what a deploy replaced (model dirs, .trtspec-engines/<name>/), for rollback

A model's relative engine_dir resolves against DIR's parent (trtspec.repository.serving.resolve_engine_dir),
so a server that sees DIR's parent as the host does (the parent mounted whole) finds the engine. Files move
by rename between DIR and DIR.trtspec (each model switches at once), which cannot cross mounts: a DIR that is
itself a mount point is refused. trtspec before this layout kept the state inside DIR (migrate.py moves it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from trtspec.errors import DeployError
from trtspec.names import check_name

STATE_SUFFIX = ".trtspec"              # DIR.trtspec/ beside the server repository DIR
ENGINES_SUBDIR = ".trtspec-engines"    # the engine inside stage and backup dirs (no model name starts with ".")
LOCK_FILE = "deploy.lock"
CANDIDATE_SUFFIX = "__trtspec_next"
KEEP_BACKUPS = 3                       # DIR.trtspec/backups/<rev>/ dirs kept after a deploy
LEGACY_BACKUP_PREFIX = ".trtspec-backup-"   # what trtspec kept inside DIR before (migrate.py)
LEGACY_STAGE_PREFIX = ".trtspec-stage-"
LEGACY_LOCK_FILE = ".trtspec-deploy.lock"
MOUNT_HINT = ("mount the volume one level up and serve a directory inside it (e.g. mount /srv, run Triton with "
              "--model-repository=/srv/models): the deploy state lives beside the repository, in DIR.trtspec/")


@dataclasses.dataclass(frozen=True)
class Layout:
    """The places of one server repository `repo` (resolved) and of its deploy state."""

    repo: Path

    @property
    def state(self) -> Path:
        return self.repo.parent / f"{self.repo.name}{STATE_SUFFIX}"

    @property
    def lock(self) -> Path:
        return self.state / LOCK_FILE

    @property
    def engines(self) -> Path:
        return self.state / "engines"

    @property
    def stages(self) -> Path:
        return self.state / "stage"

    @property
    def backups(self) -> Path:
        return self.state / "backups"

    def stage(self, revision: str) -> Path:
        return self.stages / revision

    def backup(self, revision: str) -> Path:
        return self.backups / revision

    def engine_param(self, name: str, revision: str | None = None) -> str:
        """The models' `engine_dir`, relative to DIR: the deployed engine, or (with `revision`) the staged one."""
        where = f"stage/{revision}/{ENGINES_SUBDIR}" if revision else "engines"
        return f"../{self.state.name}/{where}/{name}"

    def final(self, rel: str) -> Path:
        """Where an item of a stage or backup dir serves: a model dir in DIR, the engine in DIR.trtspec/engines."""
        head, _, rest = rel.partition("/")
        return self.engines / rest if head == ENGINES_SUBDIR else self.repo / rel

    def legacy_backup(self, path: Path) -> Path:
        """A backup recorded by an older trtspec (DIR/.trtspec-backup-<rev>) where migrate.py moved it."""
        if path.parent == self.repo and path.name.startswith(LEGACY_BACKUP_PREFIX) and not path.exists():
            return self.backup(path.name[len(LEGACY_BACKUP_PREFIX):])
        return path


def server_layout(server_repo: str | Path) -> Layout:
    """The layout of an existing server repository; a DeployError for a missing one or a mount point."""
    repo = Path(server_repo).resolve()
    if not repo.is_dir():
        raise DeployError(f"server repository {repo} is not a directory",
                          hint="pass --server-repo DIR: the model repository the running server reads")
    if os.path.ismount(repo):
        raise DeployError(f"server repository {repo} is a mount point: a deploy keeps its state beside it "
                          f"({repo.name}{STATE_SUFFIX}/) and moves files between the two by rename", hint=MOUNT_HINT)
    return Layout(repo)


def prepare(layout: Layout) -> None:
    """Make DIR.trtspec/ (readable as DIR is: the server reads the engines there) and prove that a file moves
    by rename between it and DIR."""
    try:
        layout.state.mkdir(exist_ok=True)
        for path in (layout.engines, layout.stages, layout.backups):
            path.mkdir(exist_ok=True)
    except OSError as exc:
        raise DeployError(f"cannot make the deploy state dir {layout.state}: {exc.strerror or exc}",
                          hint=f"the parent of the server repository ({layout.repo.parent}) must be writable: "
                               "the deploy state lives beside the repository") from None
    probe = layout.stages / f"probe-{_stamp()}"
    inside = layout.repo / f".{probe.name}"  # a file: Triton looks at directories only
    try:
        probe.touch()
        os.replace(probe, inside)
        os.replace(inside, probe)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise DeployError(f"cannot move files between {layout.state} and {layout.repo}: {exc.strerror or exc}",
                              hint="--server-repo and its parent must be writable") from None
        raise DeployError(f"{layout.state} and {layout.repo} are on different mounts: files cannot move between "
                          "them by rename", hint=MOUNT_HINT) from None
    finally:
        for path in (probe, inside):
            with contextlib.suppress(OSError):
                path.unlink()


def _stamp() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}-{time.monotonic_ns() % 1_000_000:06d}"


def candidate_name(model: str) -> str:
    """The name a model of the new version is loaded under beside the serving one (one path component)."""
    return check_name(f"{model}{CANDIDATE_SUFFIX}", f"candidate name of model {model!r}", DeployError)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


def _flock(path: Path, repo: Path, create: bool) -> int | None:
    """An exclusive flock on `path` (None: no such file and not `create`); DeployError when another holds it."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | (os.O_CREAT if create else 0), 0o600)
    except FileNotFoundError:
        if create:
            raise
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise DeployError(f"another deploy into {repo} is running (it holds {path})",
                          hint="wait for it to finish: deploys to one server repository run one at a time") from None
    return fd


@contextlib.contextmanager
def _deploy_lock(layout: Layout) -> Iterator[None]:
    """One deploy per server repository at a time (flock; released when the process dies). An older trtspec
    locked DIR/.trtspec-deploy.lock: while that file is there it is held too (migrate.py removes it)."""
    fds = [_flock(layout.lock, layout.repo, create=True)]
    try:
        fds.append(_flock(layout.repo / LEGACY_LOCK_FILE, layout.repo, create=False))
        yield
    finally:
        for fd in fds:
            if fd is not None:
                os.close(fd)
