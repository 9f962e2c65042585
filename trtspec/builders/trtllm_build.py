"""Builder for runtime `trtllm-engine`: convert -> plan -> trtllm-build (out of process) ->
engines/<name>/ + trtspec.lock.json -> model_repository/<name>/ (inflight_batcher_llm).

    engines/<name>/
      checkpoints/<role>/       TensorRT-LLM checkpoints (trtspec convert), with trtspec.convert.json
      target/, draft/           engines: config.json + rank<N>.engine (written by trtllm-build)
      logs/<role>.log           full trtllm-build output
      trtspec.lock.json         per engine: cache key, checkpoint digests, flags, engine file digests

Only engines whose key changed are rebuilt; each builds into a staging dir and all of them
replace the old ones only after every build succeeded, so a failure leaves the previous
engines, lock and repository untouched.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from trtspec.artifacts.pair import Drafter, weight_problems
from trtspec.builders import BuildOptions, BuildResult
from trtspec.builders.lock import (LOCK_NAME, atomic_dir, digest, new_lock, read_lock, remove_stale, swap_in,
                                   temp_dir, write_json)
from trtspec.builders.trtllm.engine_cache import checkpoint_digests, engine_digests, engine_intact, engine_key, now
from trtspec.builders.trtllm.memory import memory_plan
from trtspec.builders.trtllm.method import EngineMethod
from trtspec.builders.trtllm.plan import BuildPlan, BuildStep, make_plan, tp_pp
from trtspec.builders.trtllm.runner import run_command
from trtspec.convert import run_job
from trtspec.errors import BuildError, ConvertError, PairError
from trtspec.names import child, inside
from trtspec.repository.trtllm import render_engine_repository, write_files
from trtspec.repository.trtllm.upstream import needed_files
from trtspec.spec import Spec


def _say(options: BuildOptions, msg: str) -> None:
    if options.progress:
        from rich.console import Console

        Console(stderr=True).print(msg, markup=False, highlight=False, soft_wrap=True)


def ensure_checkpoints(spec: Spec, method: EngineMethod, root: Path, options: BuildOptions) -> list[str]:
    """Convert what is missing or stale; returns the roles converted this time."""
    converted = []
    for job in method.conversions(spec, root / "checkpoints"):
        sources_here = Path(job.model_dir).is_dir() and (job.heads_dir is None or Path(job.heads_dir).is_dir())
        if not sources_here and (job.out_dir / "config.json").is_file():
            # e.g. a GPU CI job that received the converted checkpoints as an artifact
            _say(options, f"{job.role}: HF source not here; using the converted checkpoint {job.out_dir}")
            continue
        if not sources_here:
            raise ConvertError(f"{job.role}: neither the HF checkpoint ({job.model_dir}) nor a converted one "
                               f"({job.out_dir}) exists", hint="check the spec's paths or run `trtspec convert`")
        done = run_job(job, force=options.force, log=lambda m: _say(options, m))
        if done.converted:
            converted.append(job.role)
    return converted


def check_weights(spec: Spec, method: Drafter) -> None:
    """Refuse configs that disagree with their weights (vocab, layers, heads) before converting: the
    converter would fail on some (a missing layer) and silently drop others (a layer too many)."""
    problems = weight_problems(spec, method)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PairError(f"{problems[0]}{more}", hint="`trtspec check` lists every problem")


def _validate_output(step: BuildStep, out: Path, spec: Spec) -> None:
    tp, pp = tp_pp(spec, step.role)
    missing = [n for n in ["config.json", *(f"rank{r}.engine" for r in range(tp * pp))] if not (out / n).is_file()]
    if missing:
        raise BuildError(f"trtllm-build for {step.role} exited 0 but {out} lacks {', '.join(missing)}",
                         hint="check the build log; the output layout is config.json + rank<N>.engine")
    try:
        json.loads((out / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise BuildError(f"{out}/config.json unreadable: {exc}") from None


def repository_changes(repo_dir: Path, files: dict[str, str], recorded_digest: str | None) -> list[str]:
    """Why the emitted repository must be written again: [] when every rendered file is on disk with the
    same text and the lock recorded this rendering (a deleted or edited config.pbtxt is re-emitted)."""
    if recorded_digest != digest(files):
        return ["repository configs changed (spec, paths or engines)" if recorded_digest else "no repository yet"]
    out = []
    for rel, text in sorted(files.items()):
        path = repo_dir / rel
        try:
            same = path.read_text(encoding="utf-8") == text
        except (OSError, UnicodeDecodeError):
            out.append(f"{path} missing")
            continue
        if not same:
            out.append(f"{path} changed")
    return out


def emit_repository(spec: Spec, files: dict[str, str], repo_dir: Path) -> None:
    """Write the repository atomically, keeping container-provided model.py files already there."""
    keep: dict[str, bytes] = {}
    if repo_dir.is_dir():
        try:
            for _, dst in needed_files(repo_dir):
                if dst.is_file():
                    keep[dst.relative_to(repo_dir).as_posix()] = dst.read_bytes()
        except Exception:  # an old or foreign repository: nothing to keep
            keep = {}
    with atomic_dir(repo_dir) as tmp:
        write_files(tmp, files)
        for rel, data in keep.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)


def _lock_data(spec: Spec, plan: BuildPlan, engines: dict[str, Any], repo: dict[str, Any], runtime: str
               ) -> dict[str, Any]:
    return new_lock(inputs={role: e.get("checkpoint_dir") for role, e in engines.items()},
                    outputs={role: e.get("dir") for role, e in engines.items()} | {"repository": repo["path"]},
                    runtime=runtime, name=spec.name, method=spec.method,
                    trtllm={"version": plan.trtllm_version, "image": plan.image},
                    gpu={"type": plan.gpu_type, "arch": plan.gpu_arch, "tensor_parallel": spec.gpu.tensor_parallel,
                         "pipeline_parallel": spec.gpu.pipeline_parallel},
                    engines=engines, repository=repo, spec=spec.to_dict())


def build(spec: Spec, options: BuildOptions, *, runtime: str, method: EngineMethod, drafter: Drafter
          ) -> BuildResult:
    """Plan, convert, build the changed engines, emit the repository (`runtime`: the backend's name, in the
    lock: a lock of another runtime's build is not this build's cache; `method`: the spec's method's row of its
    method table, trtspec/backends/trtllm_engine_methods.py; `drafter`: the spec's method, whose weights are
    checked)."""
    t0 = time.perf_counter()
    plan = make_plan(spec, method, engines_root=options.out_engines, trtllm_build=options.trtllm_build)
    root = inside(Path(options.out_engines), Path(plan.engines_dir), BuildError)
    repo_dir = child(Path(options.out_repo), spec.name, "model.name", BuildError)
    steps = [s.to_dict() for s in plan.steps]
    if options.dry_run:
        return BuildResult(runtime, {s.role: s.output_dir for s in plan.steps}, str(repo_dir), None, [], [],
                           steps, time.perf_counter() - t0, True)
    check_weights(spec, drafter)
    root.mkdir(parents=True, exist_ok=True)
    ensure_checkpoints(spec, method, root, options)

    lock = read_lock(root) or {}
    previous = lock.get("engines", {}) if lock.get("runtime") == runtime else {}
    todo: list[tuple[BuildStep, str, dict]] = []
    records: dict[str, Any] = {}
    skipped: list[str] = []
    reasons: list[str] = []
    for step in plan.steps:
        remove_stale(root, step.role)  # staging dirs of a killed build
        rec = previous.get(step.role) or {}
        ck = checkpoint_digests(Path(step.checkpoint_dir), rec.get("checkpoint"), use_cache=not options.force)
        key = engine_key(step, ck, plan)
        if options.force:
            why = "--force"
        elif not rec:
            why = ""  # first build of this engine: nothing to explain
        elif rec.get("key") != key:
            why = f"{step.role}: checkpoint or build flags changed"
        elif not engine_intact(Path(step.output_dir), rec.get("engine_files")):
            why = f"{step.role}: engine files in {step.output_dir} differ from the lock"
        else:
            skipped.append(step.role)
            records[step.role] = {**rec, "checkpoint": ck,
                                  "engine_files": engine_digests(Path(step.output_dir), rec.get("engine_files"))}
            continue
        todo.append((step, key, ck))
        if why and why not in reasons:
            reasons.append(why)

    staged: dict[str, Path] = {}
    try:
        for step, key, ck in todo:
            stage = temp_dir(root, step.role, "staging")
            staged[step.role] = stage
            run_step = step.with_output_dir(str(stage))
            _say(options, f"building {step.role} engine: {step.shell}")
            seconds = run_command(list(run_step.argv), label=step.role, log_path=root / "logs" / f"{step.role}.log",
                                  timeout_s=spec.runtime.trtllm.build_timeout_s, progress=options.progress,
                                  version=plan.trtllm_version, image=plan.image)
            _validate_output(step, stage, spec)
            engine_cfg = json.loads((stage / "config.json").read_text(encoding="utf-8"))
            records[step.role] = {
                "key": key, "dir": step.role, "checkpoint_dir": step.checkpoint_dir, "checkpoint": ck,
                "flags": list(step.flags), "argv": list(step.argv), "built_at": now(),
                "build_seconds": round(seconds, 3), "engine_version": engine_cfg.get("version"),
                "fake_engine": bool(engine_cfg.get("trtspec_fake_engine")),
            }
    except BaseException:
        for stage in staged.values():
            shutil.rmtree(stage, ignore_errors=True)
        raise
    for role, stage in staged.items():
        final = root / role
        swap_in(stage, final)
        records[role]["engine_files"] = engine_digests(final)

    memory = memory_plan(spec, method)
    files = render_engine_repository(spec, method, engine_dirs={s.role: s.output_dir for s in plan.steps},
                                     memory=memory)
    repo_digest = digest(files)
    changes = repository_changes(repo_dir, files, (lock.get("repository") or {}).get("digest"))
    if options.force or changes:
        emit_repository(spec, files, repo_dir)
        if changes and lock:
            reasons.append(changes[0] + (f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""))
    write_json(root / LOCK_NAME, _lock_data(spec, plan, {s.role: records[s.role] for s in plan.steps},
                                            {"path": str(repo_dir), "digest": repo_digest}, runtime))
    rebuilt = [s.role for s, _, _ in todo] + (["repository"] if changes and lock else [])
    return BuildResult(runtime, {s.role: s.output_dir for s in plan.steps}, str(repo_dir), str(root / LOCK_NAME),
                       rebuilt, skipped, steps, time.perf_counter() - t0, False, "; ".join(reasons))
