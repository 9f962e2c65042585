"""Speculative methods as plug-ins: one module per method owns everything trtspec knows about it (its spec
rules, pair rules, torch proposer, trtllm-build flags, tensorrtllm backend parameters, converter layout,
LLM-API speculative_config; the interface is trtspec/methods/base.py), and everything else asks this registry:

    methods.get(spec.method).proposer(spec, device)      methods.names()      methods.register(MyMethod())

| method      | weights           | torch proposer                   | TensorRT-LLM        | LLM API      |
|-------------|-------------------|----------------------------------|---------------------|--------------|
| draft-model | speculative.draft | a small LM's sampled chain       | 2 engines, the BLS  | Draft_Target |
| medusa      | speculative.heads | top-i of heads on the last state | medusa              | refused      |
| eagle       | speculative.heads | a one-layer feature-level head   | eagle (no PP)       | Eagle3 only  |
| lookahead   | -                 | Jacobi window + n-gram pool      | lookahead_decoding  | refused      |
| ngram       | -                 | prompt-lookup n-grams, a trie    | refused             | NGram        |
| suffix      | -                 | suffix trees, adaptive length    | refused             | SA (>= 1.3)  |
| none        | -                 | nothing (plain decoding)         | a plain engine      | plain        |
| routed      | its drafters'     | one drafter per request (router) | refused             | refused      |

(modules draft_model.py, medusa.py, eagle.py, lookahead.py, ngram.py, suffix.py, none.py, routed.py). Adding a method = one module here (a
Method subclass) and its line below; a plug-in registered at run time (`register`) is accepted by the spec,
checked, and run by the torch runtime; the TensorRT-LLM runtimes refuse a method that declares no engine or
LLM-API mapping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def engine(spec: Spec, tokenizer: Any = None) -> SpecEngine:
    """The torch runtime's engine for the spec: its method's Proposer handed to SpecEngine, as gpt-fast hands
    draft_model to speculative_decode (a method that drafts nothing runs with K = 0)."""
    from trtspec.runtime.engine import SpecEngine  # (torch: loaded when an engine is made, not with the registry)

    method = get(spec.method)
    return SpecEngine.from_spec(spec, method.proposer(spec, spec.runtime.device), tokenizer,
                                num_draft_tokens=spec.speculative.num_draft_tokens if method.drafts else 0)


from trtspec.methods import draft_model, eagle, lookahead, medusa, ngram, none, routed, suffix  # noqa: E402

for _m in (draft_model.DraftModel(), medusa.Medusa(), eagle.Eagle(), lookahead.Lookahead(), ngram.Ngram(),
           suffix.Suffix(), none.Plain(), routed.Routed()):
    register(_m)

__all__ = ["Method", "engine", "get", "names", "register", "registered", "unregister"]
