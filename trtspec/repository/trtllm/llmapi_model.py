"""trtspec's entry point of the llmapi `tensorrt_llm` model (copied into the repository as
`tensorrt_llm/1/trtspec_model.py`, named by config.pbtxt's default_model_filename): it makes model.yaml's
checkpoint paths absolute, then hands over to TensorRT-LLM's own llmapi model.py beside it (copied from the
container by `trtspec repo install-upstream`).

Why: TensorRT-LLM's model.py passes model.yaml to LLM() unchanged, so a relative path would resolve against the
server's working directory, and an absolute one ties the repository to the build machine. trtspec writes the
paths relative to the model repository (the folder holding `tensorrt_llm/`), as the torch flavour's engine_dir:

    model, tokenizer, speculative_config.speculative_model(_dir)
        relative                      -> <repository>/<path>
        absolute                      -> as written
        $TRTSPEC_CHECKPOINT_DIR = D   -> D/target, D/tokenizer (else D/target), D/speculative (a mounted copy)

The resolved file goes to a private temporary file, and $LLM_CONFIG_PATH (which model.py reads, default
model.yaml in this folder) points at it. Standard library and PyYAML only (model.py needs PyYAML too): trtspec
need not be installed in the container.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping, MutableMapping

CONFIG_ENV = "LLM_CONFIG_PATH"          # read by TensorRT-LLM's llmapi model.py
CHECKPOINT_ENV = "TRTSPEC_CHECKPOINT_DIR"
UPSTREAM = "model.py"                   # TensorRT-LLM's llmapi model, beside this file
MODEL_KEYS = ("speculative_model", "speculative_model_dir")
ROLES = {"model": "target", "tokenizer": "tokenizer", "speculative": "speculative"}


def _path(raw: str, root: Path, key: str) -> str:
    path = Path(os.path.expanduser(str(raw)))
    path = path if path.is_absolute() else Path(os.path.normpath(root / path))
    if not path.is_dir():
        raise RuntimeError(f"model.yaml {key}: checkpoint dir {path} not found (written {raw!r}; relative paths "
                           f"are relative to the model repository {root}; the variable {CHECKPOINT_ENV} "
                           "overrides them)")
    return str(path)


def resolve(data: Mapping[str, Any], root: str | Path, override: str | None = None) -> dict[str, Any]:
    """model.yaml's data with its checkpoint paths absolute: against the repository `root`, or every one under
    `override` (D/target, D/tokenizer or D/target, D/speculative). A path that is not a dir is an error."""
    root, out = Path(root), dict(data)

    def one(raw: Any, role: str, key: str) -> str:
        if override:
            d = Path(override) / ROLES[role]
            if role == "tokenizer" and not d.is_dir():
                d = Path(override) / ROLES["model"]
            return _path(str(d), root, key)
        return _path(str(raw), root, key)

    for key in ("model", "tokenizer"):
        if out.get(key):
            out[key] = one(out[key], key, key)
    sc = out.get("speculative_config")
    if isinstance(sc, Mapping):
        sc = dict(sc)
        for key in MODEL_KEYS:
            if sc.get(key):
                sc[key] = one(sc[key], "speculative", f"speculative_config.{key}")
        out["speculative_config"] = sc
    return out


def prepare(version_dir: str | Path, environ: MutableMapping[str, str] = os.environ) -> Path:
    """Resolve this model's yaml ($LLM_CONFIG_PATH or model.yaml, relative to `version_dir` as model.py reads
    it) into a private temporary file; point environ[$LLM_CONFIG_PATH] at it and return its path."""
    import yaml

    version_dir = Path(version_dir)
    src = version_dir / environ.get(CONFIG_ENV, "model.yaml")  # an absolute value wins, as in model.py
    data = yaml.safe_load(src.read_text(encoding="utf-8")) or {}
    resolved = resolve(data, version_dir.parent.parent, environ.get(CHECKPOINT_ENV) or None)
    fd, name = tempfile.mkstemp(prefix="trtspec-llmapi-", suffix=".yaml")  # 0600
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"# {src} with absolute checkpoint paths (trtspec_model.py)\n")
        yaml.safe_dump(resolved, f, sort_keys=False)
    environ[CONFIG_ENV] = name
    return Path(name)


def load_upstream(version_dir: str | Path) -> Any:
    """TensorRT-LLM's llmapi model.py beside this file, as a module (its own imports, helpers.py, see this folder)."""
    path = Path(version_dir) / UPSTREAM
    if not path.is_file():
        raise RuntimeError(f"{path} not found: copy TensorRT-LLM's llmapi model.py into the repository "
                           "(`trtspec repo install-upstream <repo>` inside the Triton TensorRT-LLM container)")
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location("trtllm_llmapi_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Loaded by Triton (Triton 2.51 imports it as module "1.trtspec_model"): resolve and hand over. Inside the trtspec
# package, or with TRTSPEC_LLMAPI_NO_LOAD set, as tests load it, only the functions above are defined.
if not (__package__ or "").startswith("trtspec") and __name__ != "__main__" \
        and not os.environ.get("TRTSPEC_LLMAPI_NO_LOAD"):
    _HERE = Path(os.path.abspath(__file__)).parent
    prepare(_HERE)
    TritonPythonModel = load_upstream(_HERE).TritonPythonModel
