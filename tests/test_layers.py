"""Imports only run downwards: every `import` / `from ... import` under trtspec/ (at module level or inside a
function, a lazy import is a dependency too; `if TYPE_CHECKING:` blocks are not) goes to its own layer or a
lower one, with no exception: the package-level import graph has no cycle. Composition happens at the top
(docs/architecture.md): the registries of methods and runtimes (the packages trtspec.methods and
trtspec.backends) are read only where a runtime is composed, and the lower layers get what they need of the
spec's method as arguments (a Proposer, a method table's row, LLM(...) arguments)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import ROOT

PACKAGE = ROOT / "trtspec"

# Lowest first. A module belongs to the layer of the longest name here that is its own or a package above it.
LAYERS: list[tuple[str, ...]] = [
    ("trtspec", "trtspec.errors", "trtspec.names", "trtspec.state"),  # (trtspec/__init__: the version)
    ("trtspec.spec",),       # the spec's shape
    ("trtspec.artifacts",),
    ("trtspec.runtime",),    # the torch engine, its Proposer interface
    ("trtspec.methods",),    # a method: its spec section and its Proposer, built from the runtime's parts
    ("trtspec.train",),      # drafters, measured through methods.engine
    ("trtspec.convert",),
    ("trtspec.repository",),
    ("trtspec.builders",),
    ("trtspec.client",),
    ("trtspec.serve",),
    ("trtspec.backends",),   # the runtimes: each looks the spec's method up in its own table, passes it down
    ("trtspec.check",),      # the spec's full validation: the method's and the runtime's rules
    ("trtspec.bench",),
    ("trtspec.export",),     # the spec for other stacks (vLLM, Kubernetes): read by the CLI only
    ("trtspec.cli", "trtspec.__main__"),
]
REGISTRIES = ("trtspec.methods", "trtspec.backends")
# Where a runtime is composed, the only modules that read the registries (lookups by name): the registries
# themselves, trtspec.check, the CLI, and what runs an engine of its own (training, benches, the exports, and the
# torch runtime's served model, the composition point of its Triton process).
COMPOSERS = ("trtspec.methods", "trtspec.backends", "trtspec.check", "trtspec.train", "trtspec.bench",
             "trtspec.export", "trtspec.cli", "trtspec.repository.torch_models.tensorrt_llm")


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
            if layer(target) > own]


def test_every_import_runs_down_the_layers():
    problems = [p for module, path in MODULES.items() for p in upward(module, imports(path))]
    assert not problems, "imports from a higher layer:\n" + "\n".join(problems)


@pytest.mark.parametrize("source, bad", [
    ("from trtspec.serve.state import read_state\n", True),                  # module level
    ("def f():\n    from trtspec.cli import main\n", True),                   # lazy imports count
    ("import trtspec.backends.torch\n", True),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trtspec.serve import Server\n", False),
    ("from trtspec import backends, errors\n", True),                        # a registry is no exception
    ("from trtspec.state import read_state\n", False),
])
def test_the_walker_sees_lazy_imports_and_no_registry_exception(tmp_path, source, bad):
    path = tmp_path / "remote.py"
    path.write_text(source)
    assert bool(upward("trtspec.client.remote", imports(path))) is bad


def node(module: str) -> str:
    """A module's node of the package-level graph: trtspec.X (a subpackage or a top-level module)."""
    return ".".join(module.split(".")[:2])


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        edges = graph.setdefault(node(module), set())
        edges.update(node(target) for _, target in imports(path) if node(target) != node(module))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph as a path [a, b, ..., a] (depth first, in name order), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str]:
        state[v] = 1
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        path.pop()
        return []

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return []


def test_the_package_import_graph_has_no_cycle():
    cycle = find_cycle(package_graph())
    assert not cycle, "import cycle between packages: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def registry_reads(module: str, found: list[tuple[int, str]]) -> list[str]:
    """Imports of a registry package itself (its lookups: get, for_spec, engine, ...) by a module that is not a
    composition point; a registry's modules (a Method's type, a runtime's table) are ordinary imports."""
    if any(module == c or module.startswith(c + ".") for c in COMPOSERS):
        return []
    return [f"{MODULES.get(module, module)}:{line}: {module} looks {target} up" for line, target in found
            if target in REGISTRIES]


def test_the_registries_are_read_only_where_runtimes_are_composed():
    problems = [p for module, path in MODULES.items() for p in registry_reads(module, imports(path))]
    assert not problems, "registry lookups below the composition points:\n" + "\n".join(problems)


@pytest.mark.parametrize("source, bad", [
    ("from trtspec import methods\n", True),
    ("def f():\n    from trtspec.methods import get\n", True),
    ("from trtspec.methods.base import Method\n", False),
    ("from trtspec.methods.lookahead import lookahead_max_draft_len\n", False),
])
def test_a_lookup_is_an_import_of_the_registry_package(tmp_path, source, bad):
    path = tmp_path / "torch_build.py"
    path.write_text(source)
    assert bool(registry_reads("trtspec.builders.torch_build", imports(path))) is bad
