"""Triton repositories for the TensorRT-LLM runtimes (owned by the trtllm builders).

    render_engine_repository(spec, method, engine_dirs=..., memory=...)   inflight_batcher_llm layout
    render_llmapi_repository(spec, ...)                                    llmapi model + model.yaml
    mpirun_command(spec, method, ...) / llmapi_command(spec, ...)          server argv, inside the container
                                          (each trtllm backend picks its own: backends.launch_command)
    install_upstream_files(repo_dir)                                       NVIDIA's model.py from the container
    relocate_repository(repo_dir, engines=..., tokenizer=...)              re-point paths (serving images)

`method` is the spec's method's row of the trtllm-engine runtime's table (trtspec/backends/
trtllm_engine_methods.py), which the backend passes in.
"""

from trtspec.repository.trtllm.common import MANIFEST, read_manifest, write_files
from trtspec.repository.trtllm.engine import OMITTED_PARAMETERS, render_engine_repository
from trtspec.repository.trtllm.launch import launch_script_command, llmapi_command, mpirun_command
from trtspec.repository.trtllm.llmapi import render_llmapi_repository
from trtspec.repository.trtllm.relocate import relocate_repository
from trtspec.repository.trtllm.upstream import install_upstream_files, missing_files

__all__ = ["MANIFEST", "OMITTED_PARAMETERS", "install_upstream_files", "launch_script_command", "llmapi_command",
           "missing_files", "mpirun_command", "read_manifest", "relocate_repository", "render_engine_repository",
           "render_llmapi_repository", "write_files"]
