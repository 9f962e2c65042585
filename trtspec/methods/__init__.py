"""Speculative methods as plug-ins: one module per method, each its spec section (rules, pair rules, checkpoints)
and its torch Proposer (the interface: trtspec/methods/base.py); this registry finds them by name.

    methods.get(spec.method).proposer(spec, device)      methods.names()      methods.register(MyMethod())
    methods.engine(spec)                                 the torch runtime's SpecEngine with the spec's proposer
    methods.check_pair(spec)                             the target and the spec's drafter checked together

Modules: draft_model.py, medusa.py, eagle.py (+ eagle3.py), lookahead.py, ngram.py, suffix.py, none.py,
routed.py. What each runtime makes of a method is that runtime's own table (trtspec/backends/
trtllm_engine_methods.py, trtllm_llmapi_methods.py); docs/architecture.md has the table of methods x runtimes.
Adding a method = one module here (a Method subclass) and its line below, plus a row in each runtime's table
that serves it. A plug-in registered at run time (`register`) is accepted by the spec, checked, and run by the
torch runtime; the TensorRT-LLM runtimes refuse a method their tables have no row for. The registry is read by
the composition points (trtspec.check, the backends, the CLI; methods.engine for whoever runs the torch engine).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trtspec.artifacts import pair
from trtspec.artifacts.pair import PairReport
from trtspec.errors import SpecError
from trtspec.methods.base import Method
from trtspec.spec import Spec

if TYPE_CHECKING:
    from trtspec.runtime.engine import SpecEngine

_METHODS: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add a method (its `name` must be new); returns it."""
    if not method.name or method.name in _METHODS:
        raise ValueError(f"method name {method.name!r} is empty or taken")
    _METHODS[method.name] = method
    return method


def unregister(name: str) -> None:
    """Remove a method registered at run time (tests' plug-ins)."""
    _METHODS.pop(name, None)


def get(name: str) -> Method:
    try:
        return _METHODS[name]
    except KeyError:
        raise SpecError(f"unknown speculative method {name!r}", hint=f"use one of {', '.join(names())}") from None


def names() -> tuple[str, ...]:
    """Every registered method's name, the built-in ones first in the spec's order."""
    return tuple(_METHODS)


def registered() -> tuple[Method, ...]:
    return tuple(_METHODS.values())


def check_pair(spec: Spec) -> PairReport:
    """The spec's target and drafter checked together: trtspec.artifacts.pair with the spec's method."""
    return pair.check_pair(spec, get(spec.method))


def engine(spec: Spec, tokenizer: Any = None, costs: Any = None) -> SpecEngine:
    """The torch runtime's engine for the spec: its method's Proposer handed to SpecEngine, as gpt-fast hands
    draft_model to speculative_decode (a method that drafts nothing runs with K = 0); `costs`: an injected
    runtime.costs.CostTable (None: the environment's, else measured). Loaded on a thread of its own."""
    from trtspec.runtime.engine import SpecEngine  # (torch: loaded when an engine is made, not with the registry)
    from trtspec.runtime.threads import on_own_thread

    method = get(spec.method)
    if spec.runtime.torch.threads:  # (here too: a thread's OpenMP team size is its own, and the caller may drive)
        import torch

        torch.set_num_threads(spec.runtime.torch.threads)
    # loaded on a thread that ends: its OpenMP workers go with it, and whichever thread drives the engine (the
    # caller's, or its scheduler thread) decodes at full speed (runtime/threads.py)
    return on_own_thread(lambda: SpecEngine.from_spec(
        spec, method.proposer(spec, spec.runtime.device), tokenizer,
        num_draft_tokens=spec.speculative.num_draft_tokens if method.drafts else 0, costs=costs))


from trtspec.methods import draft_model, eagle, lookahead, medusa, ngram, none, routed, suffix  # noqa: E402

for _m in (draft_model.DraftModel(), medusa.Medusa(), eagle.Eagle(), lookahead.Lookahead(), ngram.Ngram(),
           suffix.Suffix(), none.Plain(), routed.Routed()):
    register(_m)

__all__ = ["Method", "check_pair", "engine", "get", "names", "register", "registered", "unregister"]
