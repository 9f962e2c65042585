"""Point an emitted trtllm repository at engines/tokenizer/checkpoints in another place (a
serving image, another machine), editing the configs through the protobuf, never by text:

    trtspec repo relocate model_repository/<name> \
        --engines /engines/<name> --tokenizer /models/<name>/tokenizer [--checkpoints-from A --checkpoints-to B]

`--engines DIR` expects DIR/target (and DIR/draft for draft-model), the layout of engines/<name>/.
For llmapi repositories, `--checkpoints-from/--checkpoints-to` rewrite the path prefixes in model.yaml.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from trtspec.artifacts.fs import write_json
from trtspec.errors import RepositoryError
from trtspec.names import inside
from trtspec.repository import pbtxt
from trtspec.repository.trtllm.common import MANIFEST, read_manifest

ENGINE_PARAM = "gpt_model_path"
ROLE_OF = {"tensorrt_llm": "target", "tensorrt_llm_draft": "draft", "preprocessing": "target"}


def relocate_repository(repo_dir: Path, *, engines: str | None = None, tokenizer: str | None = None,
                        checkpoints: tuple[str, str] | None = None) -> list[str]:
    """Rewrite path parameters; returns the files changed."""
    repo_dir = Path(repo_dir)
    manifest = read_manifest(repo_dir)
    if manifest is None:
        raise RepositoryError(f"{repo_dir}: no {MANIFEST}", hint="emit the repository with `trtspec build`")
    changed = []
    for model in manifest.get("models", []):
        path = inside(repo_dir, repo_dir / model / "config.pbtxt")  # model names come from the manifest file
        cfg = pbtxt.read_config(path)
        before = pbtxt.to_text(cfg)
        if engines and model in ROLE_OF and ENGINE_PARAM in cfg.parameters:
            cfg.parameters[ENGINE_PARAM].string_value = str(Path(engines) / ROLE_OF[model])
        if tokenizer and "tokenizer_dir" in cfg.parameters:
            cfg.parameters["tokenizer_dir"].string_value = tokenizer
        if pbtxt.to_text(cfg) != before:
            path.write_text(pbtxt.to_text(cfg), encoding="utf-8")
            changed.append(str(path))
    yml = repo_dir / "tensorrt_llm" / "1" / "model.yaml"
    if yml.is_file() and (checkpoints or tokenizer):  # (an llmapi repository: engine ones have no model.yaml)
        text = yml.read_text(encoding="utf-8")
        header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
        data = yaml.safe_load(text)

        def move(p: str) -> str:
            if checkpoints and p.startswith(checkpoints[0]):
                return checkpoints[1] + p[len(checkpoints[0]):]
            return p
        data["model"] = move(data["model"])
        if tokenizer:
            data["tokenizer"] = tokenizer
        for key in ("speculative_model", "speculative_model_dir"):  # (as the TensorRT-LLM version spells it)
            if key in (data.get("speculative_config") or {}):
                data["speculative_config"][key] = move(data["speculative_config"][key])
        yml.write_text(header + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        changed.append(str(yml))
    inputs = manifest.setdefault("inputs", {})
    if engines:
        inputs["engines"] = {r: str(Path(engines) / r) for r in inputs.get("engines", {})}
    if tokenizer:
        inputs["tokenizer_dir"] = tokenizer
    write_json(repo_dir / MANIFEST, manifest)
    return changed

