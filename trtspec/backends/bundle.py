"""Assemble the docker build context of a serving image (ci/Dockerfile), for the TensorRT-LLM runtimes:

    trtspec repo bundle -c trtspec.toml --out bundle/

    bundle/engines/<name>/{target,draft}/   engines (trtllm-engine), no checkpoints or logs
    bundle/checkpoints/<name>/<role>/       HF checkpoints (trtllm-llmapi loads them itself)
    bundle/tokenizer/<name>/                tokenizer files
    bundle/models/<name>/                   the repository, re-pointed at the paths above in the image
    bundle/launch.sh                        `exec` of launch_command(...) for the image's CMD
    bundle/bundle.json                      what is where

NVIDIA's python model.py files are NOT in the bundle: the Dockerfile copies them from the
base image (/app/all_models/...), which is the same container that serves.

What the image carries besides the repository is the backend's (`Backend.bundle_payload`): the engines
(trtllm-engine: `engine_payload`) or the HF checkpoints the LLM API loads (trtllm-llmapi: `checkpoint_payload`);
its CMD is the backend's launch command.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from trtspec import methods
from trtspec.backends import for_spec
from trtspec.backends.trtllm_versions import llmapi_spelling
from trtspec.errors import RepositoryError
from trtspec.names import inside
from trtspec.repository.trtllm.common import read_manifest
from trtspec.repository.trtllm.launch import HOST_REF, launch_script
from trtspec.repository.trtllm.relocate import relocate_repository
from trtspec.spec import Spec

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _copy_tokenizer(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(Path(src).iterdir()):
        if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES) and not f.name.endswith(".index.json"):
            shutil.copy2(f, dst / f.name)


def engine_payload(spec: Spec, out: Path, manifest: dict[str, Any], repo_dst: Path, img: Path,
                   engines_root: Path) -> dict[str, str]:
    """The engines the repository points at, without checkpoints or logs; the repository re-pointed."""
    name = spec.name
    for role in (manifest.get("inputs") or {}).get("engines", {}):
        src = Path(engines_root) / name / role  # not the recorded path: artifacts move between jobs
        if not (src / "config.json").is_file():
            raise RepositoryError(f"engine {role} missing at {src}", hint="run `trtspec build` first")
        shutil.copytree(src, inside(out, out / "engines" / name / role))  # roles come from the manifest
    relocate_repository(repo_dst, engines=str(img / "engines" / name), tokenizer=str(img / "tokenizer" / name))
    return {"engines": str(img / "engines" / name)}


def checkpoint_payload(spec: Spec, out: Path, manifest: dict[str, Any], repo_dst: Path, img: Path,
                       engines_root: Path) -> dict[str, str]:
    """The HF checkpoints model.yaml names (target, and the speculative model), model.yaml re-pointed."""
    name = spec.name
    yml = repo_dst / "tensorrt_llm" / "1" / "model.yaml"
    text = yml.read_text(encoding="utf-8")
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    data = yaml.safe_load(text)
    dirs = {"target": Path(spec.model.target)}  # this machine's paths, from the spec
    sc = data.get("speculative_config") or {}

    key = llmapi_spelling(spec.runtime.trtllm.version).model_key()  # speculative_model_dir for 1.x
    if key in sc:
        dirs["speculative"] = next(iter(methods.get(spec.method).checkpoints(spec).values()))
    for role, src in dirs.items():
        shutil.copytree(src, out / "checkpoints" / name / role)
    data["model"] = str(img / "checkpoints" / name / "target")
    data["tokenizer"] = str(img / "tokenizer" / name)
    if key in sc:
        sc[key] = str(img / "checkpoints" / name / "speculative")
    yml.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return {"checkpoints": str(img / "checkpoints" / name)}


def bundle(spec: Spec, out: Path, *, engines_root: Path = Path("engines"), repo_root: Path = Path("model_repository"),
           image_root: str = "/opt/trtspec") -> Path:
    out = Path(out)
    repo_src = Path(repo_root) / spec.name
    manifest = read_manifest(repo_src)
    if manifest is None:
        raise RepositoryError(f"{repo_src}: no emitted repository", hint="run `trtspec build` first")
    if out.exists():
        if out.is_dir() and any(out.iterdir()) and not (out / "bundle.json").is_file():
            raise RepositoryError(f"refusing to replace {out}: it is not empty and holds no bundle.json",
                                  hint="pass --out a new or empty directory (or a previous bundle)")
        if out.is_dir() and not out.is_symlink():
            shutil.rmtree(out)
        else:
            out.unlink()
    name = spec.name
    img = Path(image_root)
    repo_dst = out / "models" / name
    shutil.copytree(repo_src, repo_dst)
    _copy_tokenizer(Path(spec.tokenizer_dir), out / "tokenizer" / name)
    tok_img = str(img / "tokenizer" / name)
    where: dict[str, str] = {"repository": str(img / "models" / name), "tokenizer": tok_img}
    backend = for_spec(spec)
    where |= backend.bundle_payload(spec, out, manifest, repo_dst, img, Path(engines_root))
    cmd = backend.launch_command(spec, where["repository"], host=HOST_REF)  # bind + admin key from the container's env
    (out / "launch.sh").write_text(launch_script(cmd, name), encoding="utf-8")
    (out / "launch.sh").chmod(0o755)
    (out / "bundle.json").write_text(json.dumps({"name": name, "flavour": manifest["flavour"],
                                                 "entry_model": manifest.get("entry_model"), "paths": where,
                                                 "upstream_files": manifest.get("upstream_files"),
                                                 "launch": cmd}, indent=2) + "\n", encoding="utf-8")
    return out

