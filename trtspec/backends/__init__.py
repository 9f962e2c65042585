"""The backend registry: one Backend object per runtime (`runtime.kind`), each owning its capabilities,
spec rules, build, repository, server and deploy support (trtspec/backends/base.py). Runtime kinds are
compared here and nowhere else; adding a runtime is one module plus its entry in BACKENDS.

    get("torch").capabilities.deploy          -> True
    build(spec, options)                      the spec's backend builds it (for_spec(spec).build)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.backends.base import Backend, Capabilities
from trtspec.backends.torch import TorchBackend
from trtspec.backends.trtllm_engine import TrtllmEngineBackend
from trtspec.backends.trtllm_llmapi import TrtllmLlmapiBackend
from trtspec.backends.trtllm_versions import LlmapiSpelling, llmapi_spelling
from trtspec.errors import SpecError
from trtspec.spec import Spec

if TYPE_CHECKING:
    from trtspec.builders import BuildOptions, BuildResult

__all__ = ["Backend", "Capabilities", "LlmapiSpelling", "build", "for_spec", "get", "kinds", "launch_command",
           "launch_script_command", "launch_world_size", "llmapi_spelling", "registered"]

BACKENDS: dict[str, Backend] = {b.name: b for b in (TorchBackend(), TrtllmEngineBackend(), TrtllmLlmapiBackend())}


def kinds() -> list[str]:
    return list(BACKENDS)


def registered() -> list[Backend]:
    return list(BACKENDS.values())


def get(kind: str) -> Backend:
    try:
        return BACKENDS[kind]
    except KeyError:
        raise SpecError(f"unknown runtime {kind!r}", hint=f"use one of {', '.join(BACKENDS)}") from None


def for_spec(spec: Spec) -> Backend:
    """The backend of the spec's runtime.kind."""
    return get(spec.runtime.kind)


def build(spec: Spec, options: BuildOptions) -> BuildResult:
    """Validate the spec's models and build what its runtime needs (its backend's builder)."""
    return for_spec(spec).build(spec, options)


def launch_command(spec: Spec, repo_dir: str | Path, **kwargs: Any) -> list[str]:
    """The TensorRT-LLM container's server argv for the spec's repository (trtllm runtimes)."""
    return for_spec(spec).launch_command(spec, repo_dir, **kwargs)


def launch_world_size(spec: Spec) -> int:
    return for_spec(spec).launch_world_size(spec)


def launch_script_command(spec: Spec, repo_dir: str | Path) -> list[str]:
    return for_spec(spec).launch_script_command(spec, repo_dir)
