"""Imports only run downwards: every `import` / `from ... import` under trtspec/ (at module level or inside a
function, a lazy import is a dependency too; `if TYPE_CHECKING:` blocks are not) goes to its own layer or a
lower one. One kind of call goes up, by design: a lower layer may look a plug-in up in a registry (the
packages `trtspec.methods` and `trtspec.backends` themselves, never one of their modules): that is how the
spec's validation, the converter or the engine reach the methods and runtimes without naming them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import ROOT

PACKAGE = ROOT / "trtspec"

# Lowest first. A module belongs to the layer of the longest name here that is its own or a package above it.
LAYERS: list[tuple[str, ...]] = [
    ("trtspec", "trtspec.errors", "trtspec.names", "trtspec.state"),  # (trtspec/__init__: the version)
    ("trtspec.spec",),
    ("trtspec.artifacts",),
    ("trtspec.runtime",),
    ("trtspec.train",),
    ("trtspec.convert",),
    ("trtspec.repository",),
    ("trtspec.builders",),
    ("trtspec.methods",),  # each method is built from the mechanisms below, which look it up (REGISTRIES)
    ("trtspec.client",),
    ("trtspec.serve",),
    ("trtspec.backends",),
    ("trtspec.check",),
    ("trtspec.bench",),
    ("trtspec.export",),  # the spec for other stacks (vLLM, Kubernetes): read by the CLI only
    ("trtspec.cli", "trtspec.__main__"),
]
REGISTRIES = ("trtspec.methods", "trtspec.backends")  # looked up from anywhere below: plug-ins, found by name


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def layer(module: str) -> int:
    best, found = -1, None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), i
    if found is None:
        raise AssertionError(f"{module} is in no layer of tests/test_layers.py: give it one")
    return found


class _Imports(ast.NodeVisitor):
    """(line, imported module) of every trtspec import outside `if TYPE_CHECKING:` blocks; `from a import b`
    is module a.b when that is a module."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING":
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "trtspec"]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or node.module.split(".")[0] != "trtspec":
            return
        for alias in node.names:
            sub = f"{node.module}.{alias.name}"
            self.found.append((node.lineno, sub if sub in MODULES else node.module))


def imports(path: Path) -> list[tuple[int, str]]:
    visitor = _Imports()
    visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return visitor.found


def upward(module: str, found: list[tuple[int, str]]) -> list[str]:
    own = layer(module)
    return [f"{MODULES.get(module, module)}:{line}: {module} ({LAYERS[own][0]}) imports {target} "
            f"({LAYERS[layer(target)][0]})"
            for line, target in found
            if target not in REGISTRIES and layer(target) > own]


def test_every_import_runs_down_the_layers():
    problems = [p for module, path in MODULES.items() for p in upward(module, imports(path))]
    assert not problems, "imports from a higher layer:\n" + "\n".join(problems)


@pytest.mark.parametrize("source, bad", [
    ("from trtspec.serve.state import read_state\n", True),                  # module level
    ("def f():\n    from trtspec.cli import main\n", True),                   # lazy imports count
    ("import trtspec.backends.torch\n", True),                                # a plug-in's module, not its registry
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trtspec.serve import Server\n", False),
    ("from trtspec import backends, errors\n", False),                        # the registry: a lookup
    ("from trtspec.state import read_state\n", False),
])
def test_the_walker_sees_lazy_imports_and_lets_registry_lookups_through(tmp_path, source, bad):
    path = tmp_path / "remote.py"
    path.write_text(source)
    assert bool(upward("trtspec.client.remote", imports(path))) is bad
