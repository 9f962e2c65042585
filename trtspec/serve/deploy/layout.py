"""Names and places of a deploy inside a server repository, and the one-deploy-at-a-time lock."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from trtspec.errors import DeployError
from trtspec.names import check_name

ENGINES_SUBDIR = ".trtspec-engines"
BACKUP_PREFIX = ".trtspec-backup-"
STAGE_PREFIX = ".trtspec-stage-"
LOCK_FILE = ".trtspec-deploy.lock"
CANDIDATE_SUFFIX = "__trtspec_next"


KEEP_BACKUPS = 3                       # .trtspec-backup-* dirs kept in a server repository after a deploy


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


@contextlib.contextmanager
def _deploy_lock(server_repo: Path) -> Iterator[None]:
    """One deploy per server repository at a time (flock; released when the process dies)."""
    import fcntl

    fd = os.open(server_repo / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise DeployError(f"another deploy into {server_repo} is running (it holds {LOCK_FILE})",
                              hint="wait for it to finish: deploys to one server repository run one at a time"
                              ) from None
        yield
    finally:
        os.close(fd)
