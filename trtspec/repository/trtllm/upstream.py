"""Bring NVIDIA's python `model.py` files into an emitted repository.

trtspec does not copy or vendor NVIDIA's code: the Triton TensorRT-LLM container ships it at
/app/all_models/{inflight_batcher_llm,llmapi}/<model>/1/. Each emitted repository lists in
`trtspec.repo.json` which files it needs; this module copies them, from inside the container:

    trtspec repo install-upstream model_repository/<name> [--from /app/all_models]

(`ci/Dockerfile` does the same with plain `cp`; the serving step calls `install_upstream_files`.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

from trtspec.errors import RepositoryError
from trtspec.names import inside
from trtspec.repository.trtllm.common import CONTAINER_MODELS, read_manifest


def needed_files(repo_dir: Path) -> list[tuple[str, Path]]:
    """(path relative to source_root, destination) for every upstream file the repo needs."""
    manifest = read_manifest(repo_dir)
    if not manifest or "upstream_files" not in manifest:
        raise RepositoryError(f"{repo_dir}: no trtspec.repo.json", hint="emit the repository with `trtspec build`")
    up = manifest["upstream_files"]
    group = Path(up["source_root"]).name  # inflight_batcher_llm | llmapi
    out = []
    for model, files in up["files"].items():
        for f in files:
            out.append((f"{group}/{model}/{f}", inside(repo_dir, Path(repo_dir) / model / f)))  # names from a file
    return out


def missing_files(repo_dir: Path) -> list[str]:
    return [str(dst) for _, dst in needed_files(repo_dir) if not dst.is_file()]


def install_upstream_files(repo_dir: Path, source_root: str | Path = CONTAINER_MODELS,
                           overwrite: bool = False) -> list[Path]:
    """Copy the container's model.py (and helpers) into repo_dir; returns the files written."""
    todo = [(Path(source_root) / rel, dst) for rel, dst in needed_files(Path(repo_dir))
            if overwrite or not dst.is_file()]
    absent = [str(src) for src, _ in todo if not src.is_file()]
    if absent:  # check everything first: never leave a half-copied repository
        raise RepositoryError(f"{absent[0]} not found" + (f" (and {len(absent) - 1} more)" if len(absent) > 1 else ""),
                              hint="run this inside the Triton TensorRT-LLM container "
                                   "(nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3), "
                                   "or pass --from <all_models dir>")
    written = []
    for src, dst in todo:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        written.append(dst)
    return written

