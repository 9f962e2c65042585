"""`trtspec check`: the spec, the paths, the model pair and (GPU runtimes) the memory plan."""

from __future__ import annotations

import dataclasses
from typing import Any

from trtspec.errors import ModelError
from trtspec.spec import Spec, check_paths


@dataclasses.dataclass
class CheckReport:
    spec: Spec
    problems: list[str]
    pair: dict[str, Any] | None = None
    memory_plan: Any = None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

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


def run_check(spec: Spec, models: bool = True) -> CheckReport:
    problems = [str(p) for p in check_paths(spec)] if models else []
    report = CheckReport(spec=spec, problems=problems)
    if models and not problems:
        from trtspec.models.pair import check_pair

        try:
            pair = check_pair(spec)
        except ModelError as exc:
            report.problems.append(exc.message)
            return report
        report.pair = pair.to_dict()
        report.problems.extend(str(p) for p in pair.problems)
    if spec.runtime.kind != "torch":
        _gpu_checks(spec, report, models)
    return report


def _gpu_checks(spec: Spec, report: CheckReport, models: bool) -> None:
    """Memory plan and engine/server version compatibility for the TensorRT-LLM runtimes."""
    try:
        from trtspec.build.trtllm import memory_plan  # written with the trtllm-engine runtime
    except ImportError:
        return
    if models and not report.problems:
        report.memory_plan = memory_plan(spec)
