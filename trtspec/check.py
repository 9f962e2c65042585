"""`trtspec check`: the spec, the paths, the model pair, then what the spec's runtime adds (its backend's
`check`: the GPU memory plan, built engines against the serving container's TensorRT-LLM version)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trtspec import backends, methods
from trtspec.errors import ModelError, PairError, SpecError, TrtspecError
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
        out = [f"spec {s.source}: model {s.name}, method {s.method}, runtime {backends.for_spec(s).name} on "
               f"{s.runtime.device}"]
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
    report.notes.extend(methods.get(spec.method).notes(spec))
    backends.for_spec(spec).check(spec, report, models=models, engines=engines, server_version=server_version)
    return report
