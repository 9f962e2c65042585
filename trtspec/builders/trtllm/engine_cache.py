"""Engine cache keys, the `engines/<name>/trtspec.lock.json` manifest, and engine/server
compatibility checks.

An engine's key is the sha256 of
    {checkpoint: sha256 of every file of its converted checkpoint (config.json, rank*.safetensors),
     flags: its trtllm-build flags without path values,
     trtllm_version, gpu: {type, arch}}
so changing one weight byte changes exactly one engine's key. File digests are stat-cached in
the lock (trtspec.artifacts.fs.file_digests), which keeps an unchanged re-build well under a second.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trtspec.artifacts import manifest
from trtspec.artifacts.fs import content_only, digest, file_digests, list_files
from trtspec.artifacts.manifest import now  # noqa: F401  (the engines' built_at)
from trtspec.builders.lock import LOCK_NAME, read_lock
from trtspec.builders.trtllm.plan import BuildPlan, BuildStep, make_plan

CONVERT_MANIFEST = manifest.FILE_NAMES[manifest.CONVERT]


def checkpoint_digests(ckpt_dir: Path, previous: dict[str, Any] | None = None, use_cache: bool = True
                       ) -> dict[str, dict[str, Any]]:
    files = list_files(ckpt_dir, (CONVERT_MANIFEST,), hidden=False)
    return file_digests(files, root=ckpt_dir, previous=previous, use_cache=use_cache)


def engine_key(step: BuildStep, ckpt: dict[str, dict[str, Any]], plan: BuildPlan) -> str:
    return digest({"checkpoint": content_only(ckpt), "flags": step.content_flags(),
                   "trtllm_version": plan.trtllm_version, "gpu": {"type": plan.gpu_type, "arch": plan.gpu_arch}})


def engine_digests(engine_dir: Path, previous: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    return file_digests(list_files(engine_dir, hidden=False), root=engine_dir, previous=previous)


def engine_intact(engine_dir: Path, recorded: dict[str, Any] | None) -> bool:
    """The engine dir holds exactly the files the lock recorded (stat-cached digests)."""
    if not recorded or not Path(engine_dir).is_dir():
        return False
    current = engine_digests(engine_dir, recorded)
    return content_only(current) == content_only(recorded)


# ----------------------------------------------------------------------- compatibility


def _norm_version(v: str) -> str:
    v = str(v).strip().lower().removeprefix("v")
    return re.split(r"[+\s]", v, maxsplit=1)[0]


def _engine_roots(engine_dir: Path) -> tuple[dict[str, Any] | None, dict[str, Path]]:
    """(lock, {role: engine dir}) for engines/<name>/ (with a lock) or one engine dir."""
    engine_dir = Path(engine_dir)
    lock = read_lock(engine_dir)
    if lock and isinstance(lock.get("engines"), dict):
        return lock, {role: engine_dir / e.get("dir", role) for role, e in lock["engines"].items()}
    if (engine_dir / "config.json").is_file():
        parent_lock = read_lock(engine_dir.parent)
        return parent_lock, {engine_dir.name: engine_dir}
    return None, {}


def check_engine_compat(engine_dir: str | Path, server_trtllm_version: str) -> list[str]:
    """Problems that stop a TensorRT-LLM server of `server_trtllm_version` from loading the
    engines in `engine_dir` (engines/<name>/ with its lock, or a single engine dir).

    TensorRT engines only load in the TensorRT-LLM (and TensorRT) version that built them, so any
    version difference is a problem; so are missing rank files, a lock that disagrees with the
    engine's own config.json, and engines written by the test stand-in. [] means compatible.
    """
    problems: list[str] = []
    engine_dir = Path(engine_dir)
    lock, roles = _engine_roots(engine_dir)
    if not roles:
        return [f"{engine_dir}: no engines found (no {LOCK_NAME}, no config.json); run `trtspec build`"]
    server = _norm_version(server_trtllm_version)
    if lock is not None:
        built = _norm_version(lock.get("trtllm", {}).get("version", ""))
        if built and built != server:
            problems.append(f"engines were built with TensorRT-LLM {built} but the server runs {server}; "
                            f"rebuild with runtime.trtllm.version = \"{server}\" (and its container image) "
                            "or serve with TensorRT-LLM " + built)
    for role, d in sorted(roles.items()):
        cfg_path = d / "config.json"
        if not cfg_path.is_file():
            problems.append(f"{role}: {cfg_path} missing")
            continue
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            problems.append(f"{role}: {cfg_path} unreadable: {exc}")
            continue
        v = cfg.get("version")
        if v is not None and _norm_version(v) != server:
            problems.append(f"{role}: engine config.json says TensorRT-LLM {_norm_version(v)}, server runs {server}")
        if "build_config" not in cfg and "builder_config" not in cfg:
            problems.append(f"{role}: {cfg_path} has no build_config; not a TensorRT-LLM engine dir")
        mapping = (cfg.get("pretrained_config") or {}).get("mapping", {})
        world = int(mapping.get("world_size", 1) or 1)
        missing = [f"rank{r}.engine" for r in range(world) if not (d / f"rank{r}.engine").is_file()]
        if missing:
            problems.append(f"{role}: missing {', '.join(missing)} in {d}")
        if cfg.get("trtspec_fake_engine"):
            problems.append(f"{role}: {d} holds a FAKE engine written by the test stand-in, not by trtllm-build")
        if lock is not None:
            rec = lock.get("engines", {}).get(role, {})
            if rec.get("engine_files") and not engine_intact(d, rec["engine_files"]):
                problems.append(f"{role}: engine files differ from {LOCK_NAME}; rebuild with `trtspec build`")
    return problems


# ----------------------------------------------------------------------- CI helper


def spec_engine_keys(spec, method, engines_root: Path = Path("engines")) -> dict[str, str]:
    """{role: engine cache key} for a spec (and its method's row: builders/trtllm/method.py) whose checkpoints
    are already converted (CPU only): CI computes it after `trtspec convert` to key its engine cache (see ci/)."""
    plan = make_plan(spec, method, engines_root=engines_root)
    keys = {}
    for step in plan.steps:
        ckpt = Path(step.checkpoint_dir)
        if not (ckpt / "config.json").is_file():
            raise FileNotFoundError(f"{ckpt} has no converted checkpoint; run `trtspec convert` first")
        keys[step.role] = engine_key(step, checkpoint_digests(ckpt), plan)
    return keys

