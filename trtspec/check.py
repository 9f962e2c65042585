"""`trtspec check`, and the spec's full validation: the composition point above the methods and the runtimes.

trtspec.spec validates a spec's shape; `load_spec` / `spec_from_dict` here add what needs the spec's method
(trtspec/methods/) and runtime (trtspec/backends/): the method's own rules, what the runtime cannot run and
what it takes of the method. The CLI reads every spec through them. `run_check` then checks the paths, the
model pair, and what the spec's runtime adds (its backend's `check`: the GPU memory plan, built engines
against the serving container's TensorRT-LLM version).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trtspec import backends, methods
from trtspec.errors import ModelError, PairError, SpecError, TrtspecError
from trtspec.spec import DEFAULT_SPEC, Problem, Spec, check_paths, load, rules


def meaning_problems(spec: Spec) -> list[Problem]:
    """Every cross-field rule of the spec, in one order: the spec's own (trtspec.spec), the method's
    (trtspec/methods/<name>.py) and the runtime's (trtspec/backends/: its devices, GPU, parallelism, and what it
    takes of the method)."""
    s = spec.speculative
    method, backend = methods.get(s.method), backends.for_spec(spec)
    gpu = backend.capabilities.gpu
    p = rules.schema_problems(spec)
    p += method.problems(spec)
    p += rules.drafters_problems(spec, method.routed, [m.name for m in methods.registered() if m.routed])
    if s.schedule is not None:
        p += rules.schedule_problems(spec, method.drafts)
    if s.draft_quantization is not None:
        p += rules.quantization_problems(spec, method.weights, gpu)
    p += rules.model_quantization_problems(spec, gpu)
    p += rules.length_problems(spec)
    p += backend.problems(spec)
    p += rules.gpu_count_problems(spec)
    p += backend.method_problems(spec)
    p += rules.device_problems(spec)
    p += rules.serving_problems(spec)
    return p


def spec_from_dict(data: dict[str, Any], base: Path | None = None, source: Path | None = None) -> Spec:
    """trtspec.spec.spec_from_dict with every rule: a registered method, its rules and its runtime's."""
    return load.spec_from_dict(data, base, source, methods=methods.names(), rules=meaning_problems)


def load_spec(path: str | Path = DEFAULT_SPEC) -> Spec:
    """trtspec.spec.load_spec with every rule (see spec_from_dict)."""
    return load.load_spec(path, methods=methods.names(), rules=meaning_problems)


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
        try:
            pair = methods.check_pair(spec)
        except ModelError as exc:
            report.add(ModelError, [exc.message], exc.hint)
            return report
        report.pair = pair.to_dict()
        report.add(PairError, [str(p) for p in pair.problems])
    report.notes.extend(methods.get(spec.method).notes(spec))
    backend = backends.for_spec(spec)
    report.notes.extend(backend.notes(spec))  # keys the runtime drops without effect, an unverified spelling
    backend.check(spec, report, models=models, engines=engines, server_version=server_version)
    return report
