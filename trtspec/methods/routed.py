"""routed: several drafters in one deployment, one per request (per-request draft routing).

    [speculative]                      [[speculative.drafters]]       [speculative.router]
    method = "routed"                  name = "prose"                 kind = "classify"   # or "task"
                                       method = "draft-model"         default = "prose"
                                       draft = "../models/draft"      routes = {code = "code", prose = "prose"}
                                       num_draft_tokens = 4
                                       [[speculative.drafters]]
                                       name = "code"
                                       method = "ngram"

Each drafter is a single-drafter spec of its own (spec.drafter_spec) and is checked, paired and built by its own
method exactly as it would be alone; its problems are named under `speculative.drafters[i]`. A request's drafter
is chosen once, when it is admitted (its `task`, else the router's kind), and kept for its life
(trtspec/runtime/router.py); all requests are still verified in one target pass per step.

    torch          RoutedProposer: the drafters' proposers, each over the rows routed to it
    runtimes       the TensorRT-LLM runtimes and the vLLM export refuse it: one speculative mode per engine,
                   one speculative_config per LLM, one --speculative-config per server
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtspec.methods.base import Method
from trtspec.runtime.router import RoutedProposer, Router
from trtspec.spec import _MISSING, Problem, Spec, drafter_role, drafter_spec

if TYPE_CHECKING:
    from trtspec.artifacts.hf import ModelConfig
    from trtspec.runtime.proposer import Proposer

NAME = "routed"
CLASSES = ("code", "prose")  # what the classifier answers (runtime/router.py)


def _under(i: int, problems: list[Problem]) -> list[Problem]:
    """A drafter's problems, keyed under speculative.drafters[i] instead of speculative."""
    out = []
    for p in problems:
        key = p.key.replace("speculative.", f"speculative.drafters[{i}].", 1) if p.key.startswith("speculative.") \
            else p.key
        out.append(Problem(key, p.value, p.message, p.hint))
    return out


class Routed(Method):
    name = NAME
    title = "routed drafters"
    routed = True

    def drafters(self, spec: Spec) -> list[tuple[str, Method, Spec]]:
        """(name, method, its single-drafter spec) per drafter, in the spec's order."""
        from trtspec import methods

        return [(d.name, methods.get(d.method), drafter_spec(spec, d)) for d in spec.speculative.drafters or ()]

    def problems(self, spec: Spec) -> list[Problem]:
        from trtspec import methods

        s, p = spec.speculative, super().problems(spec)
        if "num_draft_tokens" in s.model_fields_set:
            p.append(Problem("speculative.num_draft_tokens", s.num_draft_tokens, "a routed spec takes K per drafter",
                             "set num_draft_tokens in each [[speculative.drafters]] entry instead"))
        if s.heads is not None:
            p.append(Problem("speculative.heads", str(s.heads), "a routed spec's weights are its drafters'",
                             "move heads into a [[speculative.drafters]] entry"))
        if s.schedule is not None:
            p.append(Problem("speculative.schedule", s.schedule, "a schedule sets one K by load; a routed spec has "
                             "a K per drafter", "remove the schedule (adaptive K still caps each drafter by load)"))
        if not s.drafters or len(s.drafters) < 2:
            p.append(Problem("speculative.drafters", _MISSING, "a routed spec needs at least two drafters",
                             "add [[speculative.drafters]] entries (name, method, its weights), or use that "
                             "drafter's method alone"))
            return p
        names = [d.name for d in s.drafters]
        for i, d in enumerate(s.drafters):
            if names.index(d.name) != i:
                p.append(Problem(f"speculative.drafters[{i}].name", d.name, "another drafter has this name",
                                 "give each drafter its own name"))
        heads = []
        for i, (name, method, sub) in enumerate(self.drafters(spec)):
            if method.routed:
                p.append(Problem(f"speculative.drafters[{i}].method", method.name, "a drafter cannot route again",
                                 f"use one of {', '.join(n for n in methods.names() if n != NAME)}"))
                continue
            p.extend(_under(i, method.problems(sub)))
            if method.drafts and sub.speculative.adaptive.min_draft_tokens > sub.speculative.num_draft_tokens:
                p.append(Problem(f"speculative.drafters[{i}].num_draft_tokens", sub.speculative.num_draft_tokens,
                                 f"below speculative.adaptive.min_draft_tokens "
                                 f"({sub.speculative.adaptive.min_draft_tokens})",
                                 "raise it or lower min_draft_tokens"))
            if method.weights == "heads":
                heads.append(name)
        if len(heads) > 1:  # they read the target's hidden states, which an EAGLE-3 head changes (capture_layers)
            p.append(Problem("speculative.drafters", heads, "at most one drafter with heads riding on the target",
                             "keep one medusa/eagle drafter; pair it with draft-model, ngram, suffix or lookahead"))
        r = s.router
        if r is None:
            p.append(Problem("speculative.router", _MISSING, "a routed spec needs a router",
                             f"add [speculative.router] with default = \"{names[0]}\""))
            return p
        if r.default not in names:
            p.append(Problem("speculative.router.default", r.default, "no drafter has this name",
                             f"use one of {', '.join(names)}"))
        for task, target in r.routes.items():
            if target not in names:
                p.append(Problem(f"speculative.router.routes.{task}", target, "no drafter has this name",
                                 f"use one of {', '.join(names)}"))
        return p

    def notes(self, spec: Spec) -> list[str]:
        s = spec.speculative
        if not s.drafters or s.router is None:
            return []
        tasks = ", ".join(sorted({d.name for d in s.drafters} | set(s.router.routes)))
        how = ("a prompt classified as code or prose goes to routes.code / routes.prose"
               if s.router.kind == "classify" else "a request without a task")
        return [f"routed: a request's task picks its drafter ({tasks}); {how}, else to '{s.router.default}'"]

    def drafter(self, spec: Spec) -> dict[str, Any] | None:
        return {name: {"method": m.name, **(m.drafter(sub) or {})} for name, m, sub in self.drafters(spec)}

    def pair_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]:
        return [q for i, (_, m, sub) in enumerate(self.drafters(spec)) for q in _under(i, m.pair_problems(sub, target))]

    def weight_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]:
        return [q for i, (_, m, sub) in enumerate(self.drafters(spec))
                for q in _under(i, m.weight_problems(sub, target))]

    def checkpoints(self, spec: Spec) -> dict[str, Path]:
        """Each drafter's own checkpoint under its role (spec.drafter_role: "draft-<name>", "heads-<name>")."""
        out = {}
        for name, m, sub in self.drafters(spec):
            for role, path in m.checkpoints(sub).items():
                out[drafter_role(name, role)] = path
        return out

    def proposer(self, spec: Spec, device: str) -> Proposer:
        subs = [(name, m.proposer(sub, device), sub.speculative.num_draft_tokens if m.drafts else 0, m.name)
                for name, m, sub in self.drafters(spec)]
        r = spec.speculative.router
        return RoutedProposer(subs, Router(r.kind, r.default, dict(r.routes),
                                           [d.name for d in spec.speculative.drafters]))
