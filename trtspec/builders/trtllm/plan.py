"""The `trtllm-build` plan: the exact command line for every engine a spec needs.

Flags per method (TensorRT-LLM's examples/<method>/README.md; the trtllm-engine runtime's method table,
trtspec/backends/trtllm_engine_methods.py, owns each method's engines and flags and the caller passes the
spec's row in: `engine_roles`, `build_flags`):

    all           --checkpoint_dir --output_dir --gemm_plugin <dtype> --max_batch_size --max_input_len
                  --max_seq_len (input + output; the builder adds max_draft_len itself) --workers
    draft-model   target: --use_paged_context_fmha enable --speculative_decoding_mode draft_tokens_external
                          --max_draft_len K
                  draft:  --use_paged_context_fmha enable [--gather_generation_logits iff use_draft_logits]
    medusa        --speculative_decoding_mode medusa        (max_draft_len comes from the checkpoint)
    eagle         --use_paged_context_fmha enable --speculative_decoding_mode eagle   (max_batch_size <= 512)
    lookahead     --speculative_decoding_mode lookahead_decoding --max_draft_len f(W, N, G)
    then          runtime.trtllm.extra_build_args

The plan is plain data (JSON-serialisable); nothing here runs anything or reads weights.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path
from typing import Any

from trtspec.builders.trtllm.method import EngineMethod
from trtspec.errors import BuildError
from trtspec.spec import Spec, raise_first

GPU_ARCH = {"h100": "sm90", "h200": "sm90", "cpu": "none"}
# Flags whose value is a path: not part of the engine's content hash (the content is hashed instead).
PATH_FLAGS = ("--checkpoint_dir", "--output_dir")
# Flags the plan sets from the spec: extra_build_args must not set them again.
OWNED_FLAGS = ("--checkpoint_dir", "--output_dir", "--gemm_plugin", "--max_batch_size", "--max_input_len",
               "--max_seq_len", "--workers", "--speculative_decoding_mode", "--max_draft_len",
               "--use_paged_context_fmha", "--gather_generation_logits", "--model_config")


@dataclasses.dataclass(frozen=True)
class BuildStep:
    role: str                      # "target" | "draft"
    checkpoint_dir: str
    output_dir: str
    flags: tuple[str, ...]         # trtllm-build's own arguments
    argv: tuple[str, ...]          # the full command line (command prefix + flags)

    @property
    def shell(self) -> str:
        return shlex.join(self.argv)

    def content_flags(self) -> list[str]:
        """Flags without path values: what the engine depends on besides checkpoint content."""
        out, skip = [], False
        for f in self.flags:
            if skip:
                skip = False
                continue
            if f in PATH_FLAGS:
                skip = True
                continue
            if f.split("=", 1)[0] in PATH_FLAGS:
                continue
            out.append(f)
        return out

    def with_output_dir(self, output_dir: str) -> BuildStep:
        """The same step writing elsewhere (the runner builds into a staging dir)."""
        def swap(seq: tuple[str, ...]) -> tuple[str, ...]:
            out = list(seq)
            for i, f in enumerate(out[:-1]):
                if f == "--output_dir":
                    out[i + 1] = output_dir
            return tuple(out)
        return dataclasses.replace(self, output_dir=output_dir, flags=swap(self.flags), argv=swap(self.argv))

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "argv": list(self.argv), "shell": self.shell,
                "checkpoint_dir": self.checkpoint_dir, "output_dir": self.output_dir, "flags": list(self.flags)}


@dataclasses.dataclass(frozen=True)
class BuildPlan:
    name: str
    method: str
    trtllm_version: str
    image: str
    gpu_type: str
    gpu_arch: str
    engines_dir: str               # engines/<name>
    steps: tuple[BuildStep, ...]

    def step(self, role: str) -> BuildStep:
        return next(s for s in self.steps if s.role == role)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["steps"] = [s.to_dict() for s in self.steps]
        return d


def tp_pp(spec: Spec, role: str) -> tuple[int, int]:
    """The draft runs with the target's tensor parallelism and no pipeline parallelism."""
    if role == "draft":
        return spec.gpu.tensor_parallel, 1
    return spec.gpu.tensor_parallel, spec.gpu.pipeline_parallel


def build_flags(spec: Spec, method: EngineMethod, role: str, checkpoint_dir: str, output_dir: str) -> list[str]:
    lim = spec.limits
    tp, pp = tp_pp(spec, role)
    flags = ["--checkpoint_dir", checkpoint_dir, "--output_dir", output_dir,
             "--gemm_plugin", spec.trtllm_dtype,
             "--max_batch_size", str(lim.max_batch_size), "--max_input_len", str(lim.max_input_len),
             "--max_seq_len", str(lim.max_seq_len), "--workers", str(tp * pp)]
    raise_first(method.engine_problems(spec), BuildError)  # a method without engines, a rule it breaks
    flags += method.build_flags(spec, role)
    extra = list(spec.runtime.trtllm.extra_build_args)
    clash = sorted({a.split("=", 1)[0] for a in extra if a.split("=", 1)[0] in OWNED_FLAGS})
    if clash:
        raise BuildError(f"runtime.trtllm.extra_build_args sets {', '.join(clash)}, which trtspec derives from "
                         "the spec", hint="remove them from extra_build_args and change the spec key instead "
                                          "(limits, model.dtype, speculative, gpu)")
    return flags + extra


def _mount_args(paths: list[Path]) -> list[str]:
    out: list[str] = []
    for p in sorted({str(Path(p).resolve()) for p in paths}):
        out += ["-v", f"{p}:{p}"]
    return out


def command_prefix(spec: Spec, command: str | None, mounts: list[Path], label: str = "") -> list[str]:
    """How trtllm-build is invoked: a command line (default `trtllm-build` on PATH), or the word
    `docker`, which wraps the spec's Triton TRT-LLM image:

        docker run --rm --gpus all --ipc host --user UID:GID -v P:P ... <image> trtllm-build
    """
    command = command or spec.runtime.trtllm.trtllm_build
    if command.strip() == "docker":
        user = f"{os.getuid()}:{os.getgid()}" if hasattr(os, "getuid") else "0:0"
        name = [f"--name=trtspec-build-{label}-{os.getpid()}"] if label else []
        return ["docker", "run", "--rm", "--gpus", "all", "--ipc", "host", "--user", user, *name,
                *_mount_args(mounts), spec.runtime.trtllm.image, "trtllm-build"]
    argv = shlex.split(command)
    if not argv:
        raise BuildError("runtime.trtllm.trtllm_build is empty", hint="set it to `trtllm-build` or `docker`")
    return argv


def make_plan(spec: Spec, method: EngineMethod, *, engines_root: Path = Path("engines"),
              checkpoints_dir: Path | None = None, trtllm_build: str | None = None) -> BuildPlan:
    """The build plan for a spec and its method's row (trtspec/backends/trtllm_engine_methods.py); paths are
    absolute so the commands run from anywhere."""
    root = (Path(engines_root) / spec.name).resolve()
    ckpts = Path(checkpoints_dir).resolve() if checkpoints_dir else root / "checkpoints"
    steps = []
    for role in method.engine_roles(spec):
        ckpt, out = ckpts / role, root / role
        flags = build_flags(spec, method, role, str(ckpt), str(out))
        prefix = command_prefix(spec, trtllm_build, [ckpt, root], label=f"{spec.name}-{role}")
        steps.append(BuildStep(role, str(ckpt), str(out), tuple(flags), tuple(prefix + flags)))
    t = spec.runtime.trtllm
    return BuildPlan(spec.name, spec.method, t.version, t.image, spec.gpu.type, GPU_ARCH.get(spec.gpu.type, "none"),
                     str(root), tuple(steps))
