"""`trtspec build` for runtime torch: serving weights + lock in engines/<name>/, then the Triton
repository in model_repository/<name>/.

    engines/<name>/
      target/            config.json, *.safetensors in the serving dtype, tokenizer files
      draft/             (method draft-model) the same for the draft
      heads/             (method medusa / eagle) the heads, weights in the serving dtype
      spec.json          the spec with paths relative to this dir (what the serving models load)
      trtspec.lock.json  content hashes of every input, tool versions, the spec

Both dirs are written in temp dirs and renamed into place together (a failed build leaves the old
outputs). When the lock's key (inputs, spec, versions, model sources, output layout) is unchanged
and every output file still has the sha256 the lock recorded, nothing is rebuilt unless `force`.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from trtspec.artifacts.pair import check_pair
from trtspec.artifacts.weights import load_file
from trtspec.builders import BuildOptions, BuildResult
from trtspec.builders.lock import (
    LOCK_FORMAT,
    LOCK_NAME,
    atomic_dir,
    digest,
    hash_tree,
    new_lock,
    read_lock,
    sha256_file,
    tool_versions,
    tree_changes,
    write_json,
)
from trtspec.errors import BuildError, PairError, SpecError
from trtspec.methods.base import Method
from trtspec.names import child
from trtspec.repository import torch_repo
from trtspec.repository.serving import ENGINE_SPEC
from trtspec.repository.torch_repo import MODEL_SOURCES, ModelNames, emit_torch_repository, model_source
from trtspec.spec import Spec, check_paths, drafter_role

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")
COPY_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".py")


def roles(spec: Spec, method: Method) -> dict[str, Path]:
    """role -> input checkpoint dir of everything the deployment serves: the target and its method's own."""
    return {"target": Path(spec.model.target)} | method.checkpoints(spec)


def validate(spec: Spec, method: Method) -> None:
    """The checks of `trtspec check`: paths exist, checkpoints and the pair fit together."""
    problems = check_paths(spec)
    if problems:
        raise SpecError(str(problems[0]), hint="fix the paths in the spec, then re-run `trtspec build`",
                        problems=[str(p) for p in problems])
    report = check_pair(spec, method)
    if report.problems:
        first = report.problems[0]
        more = f" (and {len(report.problems) - 1} more)" if len(report.problems) > 1 else ""
        raise PairError(f"{first}{more}", hint="`trtspec check` lists every problem")


def engine_spec_dict(spec: Spec, role_dirs: dict[str, Path]) -> dict[str, Any]:
    """The spec as the serving models load it: checkpoint paths point at the engine's role dirs."""
    data = spec.to_dict()
    data["model"]["target"] = "target"
    data["model"].pop("tokenizer", None)
    data["speculative"]["draft"] = "draft" if "draft" in role_dirs else None
    data["speculative"]["heads"] = "heads" if "heads" in role_dirs else None
    for d in data["speculative"].get("drafters") or ():  # a routed spec: each drafter's weights in its role dir
        for key in ("draft", "heads"):
            d[key] = drafter_role(d["name"], key) if drafter_role(d["name"], key) in role_dirs else None
    return _strip_none(data)


def _strip_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _strip_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_strip_none(v) for v in obj]
    return obj


def lock_key(spec: Spec, inputs: dict[str, dict[str, str]], options: BuildOptions, names: ModelNames) -> str:
    versions = tool_versions()
    sources = {role: digest(model_source(role).decode("utf-8")) for role in MODEL_SOURCES}
    layout = {"engines": str(Path(options.out_engines).resolve()), "repo": str(Path(options.out_repo).resolve()),
              "names": names.to_dict()}
    return digest({"format": LOCK_FORMAT, "inputs": inputs, "spec": spec.to_dict(), "versions": versions,
                   "sources": sources, "layout": layout, "builder": _builder_digest()})


def _builder_digest() -> str:
    """This builder's and the emitter's code: a change to either re-emits the outputs."""
    return digest([Path(m.__file__).read_text(encoding="utf-8") for m in (sys.modules[__name__], torch_repo)])


def convert_checkpoint(src: Path, dst: Path, dtype: str) -> list[str]:
    """Copy a checkpoint dir with its weights as safetensors in `dtype`; returns the files written."""
    import torch
    from safetensors.torch import save_file

    target_dtype = getattr(torch, dtype)  # the spec's dtype names are torch's
    dst.mkdir(parents=True, exist_ok=True)
    written = []

    def cast(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: (v.to(target_dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}

    bins = sorted(src.glob("*.bin"))
    if len(bins) > 1 or (src / "pytorch_model.bin.index.json").exists():
        raise BuildError(f"{src}: sharded PyTorch .bin weights are not supported",
                         hint="re-save the checkpoint with safetensors (save_pretrained(safe_serialization=True))")
    for path in sorted(src.iterdir()):
        if path.is_dir():
            continue
        if path.suffix == ".safetensors":
            tensors = load_file(path, BuildError)
            save_file(cast(tensors), str(dst / path.name), metadata={"format": "pt"})
        elif path.suffix == ".bin":
            state = torch.load(str(path), map_location="cpu", weights_only=True)
            name = "model.safetensors" if path.name == "pytorch_model.bin" else path.with_suffix(".safetensors").name
            save_file(cast(state), str(dst / name), metadata={"format": "pt"})
            written.append(name)
            continue
        elif path.name == "config.json":
            cfg = json.loads(path.read_text(encoding="utf-8"))
            cfg["torch_dtype"] = dtype
            if "dtype" in cfg:
                cfg["dtype"] = dtype
            (dst / path.name).write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        elif path.suffix in COPY_SUFFIXES or path.name in TOKENIZER_FILES:
            shutil.copyfile(path, dst / path.name)
        else:
            continue
        written.append(path.name)
    if not any(n.endswith(".safetensors") for n in written):
        raise BuildError(f"{src}: no weights (*.safetensors or pytorch_model.bin)",
                         hint="point the spec at a checkpoint dir that holds its weights")
    return written


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    copied = [name for name in TOKENIZER_FILES if (src / name).is_file()]
    if not copied:
        raise BuildError(f"no tokenizer files in {src}", hint="set model.tokenizer to a dir with tokenizer.json")
    for name in copied:
        shutil.copyfile(src / name, dst / name)
    return copied


def rebuild_reason(lock: dict[str, Any] | None, key: str, options: BuildOptions, name: str, engine_dir: Path,
                   repo_dir: Path) -> str | None:
    """Why the outputs must be (re)built, or None when the lock's key matches and every output file still
    has the hash the lock recorded (a flipped weight byte or a deleted model.py is rebuilt, not trusted).
    A first build (no lock) has no reason to give: ""."""
    if lock is None:
        return ""
    if options.force:
        return "--force"
    if lock.get("key") != key:
        return "inputs, spec, versions or builder changed"
    repo_files = (lock.get("repository") or {}).get("files")
    for shown, root, recorded in ((Path(options.out_engines) / name, engine_dir, lock.get("outputs")),
                                  (Path(options.out_repo) / name, repo_dir, repo_files)):
        if not isinstance(recorded, dict):
            return f"{shown}: its files are not in the lock"
        changes = tree_changes(root, recorded)
        if changes:
            more = f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""
            return f"{shown}/{changes[0]}{more}"
    return None


def build(spec: Spec, options: BuildOptions, *, runtime: str, method: Method) -> BuildResult:
    """Validate, write engines/<name>/ and model_repository/<name>/ atomically, or skip if unchanged
    (`runtime`: the backend's name, recorded in the lock; `method`: the spec's)."""
    start = time.perf_counter()
    validate(spec, method)
    role_dirs = roles(spec, method)
    engine_dir = child(Path(options.out_engines), spec.name, "model.name", BuildError)
    repo_dir = child(Path(options.out_repo), spec.name, "model.name", BuildError)
    names = ModelNames.for_spec(spec)
    inputs = {role: hash_tree(path) for role, path in role_dirs.items()}
    inputs["tokenizer"] = {n: sha256_file(spec.tokenizer_dir / n) for n in TOKENIZER_FILES
                           if (spec.tokenizer_dir / n).is_file()}
    key = lock_key(spec, inputs, options, names)
    engines = {role: str(engine_dir / role) for role in role_dirs}
    lock_path = engine_dir / LOCK_NAME
    reason = rebuild_reason(read_lock(engine_dir), key, options, spec.name, engine_dir, repo_dir)
    if reason is None:
        return BuildResult(runtime=runtime, engines=engines, repository=str(repo_dir), lock=str(lock_path),
                           rebuilt=[], skipped=list(role_dirs), seconds=time.perf_counter() - start)

    with atomic_dir(engine_dir) as tmp_engine, atomic_dir(repo_dir) as tmp_repo:
        files = {}
        for role, src in role_dirs.items():
            files[role] = convert_checkpoint(src, tmp_engine / role, spec.model.dtype)
        files["tokenizer"] = copy_tokenizer(spec.tokenizer_dir, tmp_engine / "target")
        write_json(tmp_engine / ENGINE_SPEC, engine_spec_dict(spec, role_dirs))
        repo = emit_torch_repository(spec, tmp_repo, engine_dir, final_root=repo_dir, names=names)
        lock = new_lock(
            inputs={role: {"path": str(path), "files": inputs[role]} for role, path in role_dirs.items()}
            | {"tokenizer": {"path": str(spec.tokenizer_dir), "files": inputs["tokenizer"]}},
            outputs=hash_tree(tmp_engine),
            key=key, name=spec.name, runtime=runtime, method=spec.method, dtype=spec.model.dtype,
            repository=repo.to_dict() | {"root": str(repo_dir), "files": hash_tree(tmp_repo)},
            spec=spec.to_dict())
        write_json(tmp_engine / LOCK_NAME, lock)
    if spec.runtime.device == "cpu":  # the fused CPU kernel, compiled now (once per machine) rather than at model load
        from trtspec.runtime import fused

        fused.available()
    return BuildResult(runtime=runtime, engines=engines, repository=str(repo_dir), lock=str(lock_path),
                       rebuilt=list(role_dirs), skipped=[], seconds=time.perf_counter() - start, reason=reason)
