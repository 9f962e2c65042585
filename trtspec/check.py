"""`trtspec check`: the spec, the paths, the model pair and (GPU runtimes) the memory plan."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trtspec.errors import BuildError, ModelError, PairError, SpecError, TrtspecError
from trtspec.spec import Spec, check_paths


@dataclasses.dataclass
class CheckReport:
    spec: Spec
    problems: list[str]
    pair: dict[str, Any] | None = None
    memory_plan: Any = None
    notes: list[str] = dataclasses.field(default_factory=list)
    # The class of the first problem: `trtspec check` exits with its code, as `build` would (the spec: 2,
    # the models and their pair: 3, built engines: 4).
    error: type[TrtspecError] | None = None
    hint: str | None = None  # the first problem's own hint, when it came with one (a broken file, ...)

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, error: type[TrtspecError], problems: list[str], hint: str | None = None) -> None:
        if problems and self.error is None:
            self.error, self.hint = error, hint
        self.problems.extend(problems)

    def exception(self) -> TrtspecError:
        """The error `trtspec check` raises for these problems (first one in the message, all listed)."""
        hint = self.hint or "fix the keys named above, then re-run `trtspec check`"
        exc = (self.error or SpecError)(self.problems[0], hint=hint)
        exc.problems = list(self.problems)  # the CLI prints every one
        return exc

    def lines(self) -> list[str]:
        s = self.spec
        out = [f"spec {s.source}: model {s.name}, method {s.method}, runtime {s.runtime.kind} on {s.runtime.device}"]
        if self.pair:
            out.append(f"target: {self.pair['target']}")
            if self.pair.get("drafter"):
                out.append(f"drafter: {self.pair['drafter']}")
        if self.memory_plan is not None:
            out.append(str(self.memory_plan))
        out.extend(f"note: {n}" for n in self.notes)
        if self.ok:
            out.append("ok")
        return out

    def to_dict(self) -> dict[str, Any]:
        plan = self.memory_plan
        if hasattr(plan, "to_dict"):
            plan = plan.to_dict()
        return {"ok": self.ok, "spec": self.spec.to_dict(), "problems": self.problems, "pair": self.pair,
                "memory_plan": plan, "notes": self.notes}


def run_check(spec: Spec, models: bool = True, engines: Path | None = Path("engines"),
              server_version: str | None = None) -> CheckReport:
    """Everything `trtspec check` reports. `server_version` is the TensorRT-LLM version of the
    serving container (default: runtime.trtllm.version of the spec)."""
    report = CheckReport(spec=spec, problems=[])
    report.add(SpecError, [str(p) for p in check_paths(spec)] if models else [])
    if models and report.ok:
        from trtspec.artifacts.pair import check_pair

        try:
            pair = check_pair(spec)
        except ModelError as exc:
            report.add(ModelError, [exc.message], exc.hint)
            return report
        report.pair = pair.to_dict()
        report.add(PairError, [str(p) for p in pair.problems])
    if spec.runtime.kind != "torch":
        _gpu_checks(spec, report, models, engines, server_version)
    return report


def _gpu_checks(spec: Spec, report: CheckReport, models: bool, engines: Path | None,
                server_version: str | None) -> None:
    """Memory plan, and engine/server TensorRT-LLM version compatibility (trtllm-engine)."""
    if models and report.pair is not None:
        from trtspec.builders.trtllm.memory import memory_plan

        plan = memory_plan(spec)
        if plan.ok:
            report.memory_plan = "\n".join(plan.lines())
        report.add(PairError, [f"memory plan: {p}" for p in plan.problems])
    if spec.runtime.kind == "trtllm-engine" and engines is not None:
        engine_dir = Path(engines) / spec.name
        if engine_dir.is_dir():
            from trtspec.builders.trtllm.cache import check_engine_compat

            version = server_version or spec.runtime.trtllm.version
            report.notes.append(f"engines {engine_dir} checked against TensorRT-LLM {version} on the server")
            report.add(BuildError, [f"engines: {p}" for p in check_engine_compat(engine_dir, version)])
