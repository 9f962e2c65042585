"""Per-request draft routing (method "routed", trtspec/methods/routed.py): several drafters in one engine.

A request's drafter is chosen once, when it is admitted (`Router.choose`: its `task`, else the router's kind),
and kept for its life: a drafter's state (a draft KV cache, an n-gram index) is built over the request's own
sequence, so switching mid-request would mean rebuilding it. Every step all requests are still verified in ONE
target pass; only proposing is split.

RoutedProposer gives each drafter its own dense row space: drafter d sees only the requests routed to it, as
rows 0..n_d-1 of its own state, in a sub-batch of the step (so a draft model never runs, nor catches up its KV
cache, over a request it does not draft for). `rows[d][i]` is the engine row of drafter d's row i; the engine's
row moves are mirrored (a request leaving drafter d moves d's last row into its place, as the engine does).

The classifier (`classify`) is deliberately cheap and explainable, run once per request on the decoded prompt:
a prompt is "code" when code-like characters and keywords make up at least CODE_SHARE of its non-space
characters (brackets, operators, quotes, `#`, `_`, indented lines, and code constructs such as `def f(`,
`import x`, `return`, `self.`, `==`, `->` each weighing more than one character), else "prose". A request for
code written in prose ("Write a Python function that ...") is prose: what the prompt holds is what a copying
drafter can reuse. Draft-free drafters that copy from the context (ngram, suffix)
tend to win on code and edits; a draft model or head on prose (bench/bench_routing.py measures it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from trtspec.errors import GenerationError
from trtspec.runtime.proposer import EMPTY, Draft, DraftPlan, ProposalBatch, Proposer

if TYPE_CHECKING:
    import torch

CODE_SHARE = 0.08      # code-like weight per non-space character above which a prompt is code
CLASSIFY_CHARS = 4000  # the classifier reads the prompt's last this-many characters
SYMBOLS = frozenset("()[]{}<>=+-*/%&|^~:;\"'`#_\\@$")
# code constructs, not words English shares ("class", "function", "print" alone are prose too)
KEYWORDS = re.compile(r"\bdef \w+\(|\bclass \w+[:(]|^\s*(?:import|from) [\w.]+|\breturn\b|\bself\.|\bprint\(|"
                      r"\bfunction\s*\w*\s*\(|#include\b|\blambda\b|\belif\b|\bNone\b|=>|==|!=|\+=|->|::|&&|\|\|",
                      re.MULTILINE)
KEYWORD_WEIGHT, INDENT_WEIGHT = 4, 2


def code_share(text: str) -> float:
    """Code-like weight per non-space character (see the module docstring)."""
    text = text[-CLASSIFY_CHARS:]
    chars = sum(1 for c in text if not c.isspace())
    if not chars:
        return 0.0
    weight = sum(1 for c in text if c in SYMBOLS)
    weight += KEYWORD_WEIGHT * len(KEYWORDS.findall(text))
    weight += INDENT_WEIGHT * sum(1 for line in text.split("\n")[1:] if line.startswith(("    ", "\t")))
    return weight / chars


def classify(text: str) -> str:
    """"code" or "prose" (see the module docstring)."""
    return "code" if code_share(text) >= CODE_SHARE else "prose"


class Router:
    """Which drafter (an index into `names`) a request uses: an explicit task (a drafter's name or a key of
    `routes`), else `default` (kind "task") or the prompt's class looked up in `routes` (kind "classify").
    An unknown task is refused, not sent to the default: a misspelt task would otherwise silently lose its
    speed-up (the output is the same either way), and the client learns the valid ones at once."""

    def __init__(self, kind: str, default: str, routes: dict[str, str], names: Sequence[str]):
        self.kind, self.names, self.routes = kind, list(names), dict(routes)
        self.index = {n: i for i, n in enumerate(self.names)}
        self.default = self.index[default]

    @property
    def tasks(self) -> list[str]:
        return sorted(set(self.names) | set(self.routes))

    def choose(self, task: str | None, text=None) -> int:
        """`text`: the prompt's text, or a callable giving it (decoded only when the classifier needs it)."""
        if task is not None:
            name = self.routes.get(task, task)
            if name not in self.index:
                raise GenerationError(f"unknown task {task!r}", hint=f"send one of {', '.join(self.tasks)}, or no "
                                      "task (the router decides)")
            return self.index[name]
        if self.kind == "classify" and text is not None:
            name = self.routes.get(classify(text() if callable(text) else text))
            if name is not None:
                return self.index[name]
        return self.default


class RoutedProposer(Proposer):
    """The drafters' proposers, each over the rows routed to it (see the module docstring)."""

    name = "routed"

    def __init__(self, drafters: Sequence[tuple[str, Proposer, int, str]], router: Router):
        """drafters: (name, proposer, its K, its method's name) in the spec's order."""
        self.names = [d[0] for d in drafters]
        self.subs = [d[1] for d in drafters]
        self.ks = [d[2] for d in drafters]
        self.methods = [d[3] for d in drafters]
        self.router = router
        self.rows: list[list[int]] = [[] for _ in self.subs]  # drafter d's row i is engine row rows[d][i]
        self.route: dict[int, int] = {}                      # engine row -> its drafter
        self._called: list[int] = []

    def max_nodes(self, k: int) -> int:
        return max(p.max_nodes(kd) for p, kd in zip(self.subs, self.ks))

    def setup(self, target, max_batch: int, max_seq: int, k: int) -> DraftPlan:
        """Each drafter set up with its own K; `plans[d]` is what adaptive K of drafter d's requests picks from.
        The plan returned only bounds the engine (the largest K, all options)."""
        self.plans = [p.setup(target, max_batch, max_seq, kd) for p, kd in zip(self.subs, self.ks)]
        options = tuple(sorted({o for plan in self.plans for o in plan.options}))
        return DraftPlan(max(plan.k_max for plan in self.plans), options,
                         k_is_depth=all(plan.k_is_depth for plan in self.plans))

    def clear(self) -> None:
        """Forget every row (the engine reset its caches after a failed step)."""
        for d, rows in enumerate(self.rows):
            for i in reversed(range(len(rows))):
                self.subs[d].release(i)
            rows.clear()
        self.route.clear()

    def assign(self, row: int, drafter: int) -> None:
        """The request about to be admitted into engine `row` uses `drafter` (before `admit`)."""
        if row in self.route:  # not released (cannot happen through the engine; keeps the rows dense anyway)
            self.release(row)
        self.route[row] = drafter
        self.rows[drafter].append(row)

    def admit(self, row: int, hidden: torch.Tensor) -> None:
        d = self.route[row]
        self.subs[d].admit(self.rows[d].index(row), hidden)

    def release(self, row: int) -> None:
        d = self.route.pop(row, None)
        if d is None:
            return
        rows, sub = self.rows[d], self.subs[d]
        i, last = rows.index(row), len(rows) - 1
        sub.release(i)
        if i != last:  # the drafter's last row fills the hole, as the engine keeps its own rows
            sub.move_row(last, i)
            rows[i] = rows[last]
        rows.pop()

    def move_row(self, src: int, dst: int) -> None:
        """Engine row src now lives in dst (the engine released dst first): only the mapping changes."""
        d = self.route.pop(src)
        self.route[dst] = d
        rows = self.rows[d]
        rows[rows.index(src)] = dst

    def lag(self, row: int, length: int) -> int:
        d = self.route.get(row)
        return 0 if d is None else self.subs[d].lag(self.rows[d].index(row), length)

    def _sub_batch(self, batch: ProposalBatch, rows: list[int]) -> ProposalBatch:
        return ProposalBatch([batch.seqs[g] for g in rows], [batch.params[g] for g in rows],
                             [batch.ks[g] for g in rows], [batch.draws[g] for g in rows])

    def propose(self, batch: ProposalBatch) -> list[Draft]:
        drafts: list[Draft] = [EMPTY] * len(batch)
        self._called = []
        for d, rows in enumerate(self.rows):
            if not rows:
                continue
            self._called.append(d)
            for g, draft in zip(rows, self.subs[d].propose(self._sub_batch(batch, rows))):
                drafts[g] = draft
        return drafts

    def commit_branch(self, outputs: list[list[int] | None]) -> None:
        for d in self._called:
            sub = [outputs[g] for g in self.rows[d]]
            if any(o is not None for o in sub):
                self.subs[d].commit_branch(sub)

    def commit(self, paths: list[list[int]], hidden: torch.Tensor) -> None:
        import torch

        called, self._called = self._called, []
        for d in called:
            rows = self.rows[d]
            self.subs[d].commit([paths[g] for g in rows], hidden[torch.tensor(rows, device=hidden.device)])
