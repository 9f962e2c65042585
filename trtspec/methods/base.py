"""The Method interface: a speculative method is its spec section and its Proposer, as small hooks with defaults.

A method module (trtspec/methods/<name>.py) subclasses Method, overrides what differs, and trtspec.methods
registers one instance. What a runtime makes of a method is that runtime's own table, not the method's
(trtspec/backends/trtllm_engine_methods.py, trtllm_llmapi_methods.py; docs/architecture.md has the table of
methods x runtimes); the CLI and the backends look the method up (`methods.get(name)`) and call these hooks.

    identity      name, title, weights ("draft": speculative.draft, "heads": speculative.heads, None),
                  tree (takes speculative.choices), drafts (False: plain decoding), routed (several drafters)
    spec rules    problems(spec); notes(spec): what `trtspec check` adds without failing
    pair rules    drafter(spec), pair_problems(spec, target), weight_problems(spec, target)
    checkpoints   checkpoints(spec) -> {role: dir}: what the torch build copies, the LLM API loads, a bundle ships
    torch         proposer(spec, device) -> Proposer (trtspec/runtime/proposer.py)

The defaults describe a method that only proposes: it runs on the torch runtime, and a runtime whose table has
no row for it refuses it (a spec problem, never a half-built engine). A method module must not import torch at
module level: the registry is read by spec validation, which the CLI and the clients run without torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from trtspec.spec import _MISSING, MAX_DRAFT_TOKENS, Problem, Spec

if TYPE_CHECKING:
    from trtspec.artifacts.hf import ModelConfig
    from trtspec.runtime.proposer import Proposer


class Method:
    name: ClassVar[str] = ""
    title: ClassVar[str] = ""            # as messages spell it ("EAGLE")
    weights: ClassVar[Literal["draft", "heads"] | None] = None
    tree: ClassVar[bool] = False
    drafts: ClassVar[bool] = True
    routed: ClassVar[bool] = False       # takes speculative.drafters / speculative.router (one per request)

    def __repr__(self) -> str:
        return f"<method {self.name}>"

    # ------------------------------------------------------------------------------------------ spec rules

    def problems(self, spec: Spec) -> list[Problem]:
        """The spec's [speculative] section as this method reads it: its weights given, the others' not, a
        tree only where one is taken (and then a valid one, every node a draft token)."""
        from trtspec import methods

        s, p = spec.speculative, []
        if self.weights == "draft" and s.draft is None:
            p.append(Problem("speculative.draft", _MISSING, f"method '{self.name}' needs a draft checkpoint",
                             "set speculative.draft = \"path/to/draft\" or choose another method"))
        if self.weights == "heads" and s.heads is None:
            p.append(Problem("speculative.heads", _MISSING, f"method '{self.name}' needs its heads dir",
                             f"set speculative.heads = \"path/to/{self.name}\""))
        if self.weights != "draft" and s.draft is not None:
            users = [m.name for m in methods.registered() if m.weights == "draft"]
            p.append(Problem("speculative.draft", str(s.draft),
                             f"only used by method {' or '.join(repr(u) for u in users)} (method is '{self.name}')",
                             "remove speculative.draft" + (f" or set method = \"{users[0]}\"" if users else "")))
        if s.choices is not None:
            if not self.tree:
                trees = [m.name for m in methods.registered() if m.tree]
                p.append(Problem("speculative.choices", s.choices, f"a tree only applies to {' and '.join(trees)}",
                                 "remove speculative.choices"))
            else:
                p.extend(choice_problems(s.choices))
                if len(s.choices) > s.num_draft_tokens:
                    p.append(Problem("speculative.num_draft_tokens", s.num_draft_tokens,
                                     f"the tree in speculative.choices has {len(s.choices)} nodes; every node is a "
                                     "draft token (TensorRT-LLM's max_draft_len)",
                                     f"set num_draft_tokens >= {len(s.choices)} or prune the tree"))
        return p

    def notes(self, spec: Spec) -> list[str]:
        """What `trtspec check` tells about the method without failing (a changed meaning, a privacy trade)."""
        return []

    # ------------------------------------------------------------------------------------------ pair rules

    def drafter(self, spec: Spec) -> dict[str, Any] | None:
        """A summary of the drafter's config for `check`'s report (None: no drafter checkpoint)."""
        return None

    def pair_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]:
        """What does not fit between the drafter and the target (reads config files only)."""
        return []

    def weight_problems(self, spec: Spec, target: ModelConfig) -> list[Problem]:
        """The drafter's config.json vs its weights (safetensors headers); [] when not there."""
        return []

    def checkpoints(self, spec: Spec) -> dict[str, Path]:
        """role -> the method's own checkpoint dir(s) besides the target ("draft" or "heads")."""
        s = spec.speculative
        path = s.draft if self.weights == "draft" else s.heads if self.weights == "heads" else None
        return {self.weights: Path(path)} if self.weights and path is not None else {}

    # ------------------------------------------------------------------------------------------ torch runtime

    def proposer(self, spec: Spec, device: str) -> Proposer:
        """The torch runtime's proposer for the spec (weights load in its `setup`)."""
        raise NotImplementedError(f"method {self.name!r} has no proposer")


def choice_problems(choices: list[list[int]]) -> list[Problem]:
    """A `choices` tree: non-empty non-negative top-i paths, each prefix listed before its path, no duplicate."""
    p = []
    seen = set()
    for i, path in enumerate(choices):
        key = f"speculative.choices[{i}]"
        if not path:
            p.append(Problem(key, path, "empty path", "remove it: the root is implicit"))
            continue
        if any(c < 0 for c in path):
            p.append(Problem(key, path, "top-i indices must be >= 0", "use non-negative indices"))
        if tuple(path[:-1]) not in seen and len(path) > 1:
            p.append(Problem(key, path, f"parent path {path[:-1]} is not listed before it",
                             "list every prefix of a path before the path"))
        if tuple(path) in seen:
            p.append(Problem(key, path, "duplicate path", "remove the duplicate"))
        seen.add(tuple(path))
    if len(choices) > MAX_DRAFT_TOKENS * 4:
        p.append(Problem("speculative.choices", f"{len(choices)} paths", "tree too large", "use at most 256 paths"))
    return p

