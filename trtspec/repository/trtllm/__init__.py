"""Triton repositories for the TensorRT-LLM runtimes (owned by the trtllm builders).

    render_engine_repository(spec, engine_dirs=..., memory=...)  inflight_batcher_llm layout
    render_llmapi_repository(spec)                                llmapi model + model.yaml
    launch_command(spec, repo_dir) -> list[str]                   server argv, inside the container
    install_upstream_files(repo_dir)                              NVIDIA's model.py from the container
    relocate_repository(repo_dir, engines=..., tokenizer=...)     re-point paths (serving images)
"""

from trtspec.repository.trtllm.common import MANIFEST, read_manifest, write_files
from trtspec.repository.trtllm.engine import OMITTED_PARAMETERS, render_engine_repository
from trtspec.repository.trtllm.launch import launch_command, launch_script_command, launch_world_size
from trtspec.repository.trtllm.llmapi import render_llmapi_repository
from trtspec.repository.trtllm.relocate import relocate_repository
from trtspec.repository.trtllm.upstream import install_upstream_files, missing_files

__all__ = ["MANIFEST", "OMITTED_PARAMETERS", "install_upstream_files", "launch_command", "launch_script_command",
           "launch_world_size", "missing_files", "read_manifest", "relocate_repository", "render_engine_repository",
           "render_llmapi_repository", "write_files"]
