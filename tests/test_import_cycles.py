"""No import cycle inside the project's packages (docs/architecture.md, "Layers").

A module's imports are every ``import``/``from ... import`` it runs, at module level or
inside a function (a lazy import that only breaks a cycle at import time still ties the two
modules together), but not those under ``if TYPE_CHECKING:`` (annotations only: never run).
``from package import name`` counts as importing the submodule ``package.name`` when one
exists, else the package. A cycle is a strongly connected set of two or more modules of one
top-level package; the check sees one it is shown (a planted pair).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layers import ALLOWED, NAMESPACE, REPO, layer_dir

Graph = dict[str, set[str]]


def modules(root: Path, packages: set[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``root``."""
    found: dict[str, Path] = {}
    for pkg in sorted(packages):
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def run_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that can run: all but those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    walk(other)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append(child)
            walk(child)

    walk(tree)
    return found


def import_graph(mods: dict[str, Path]) -> Graph:
    """Module -> the modules of its own top-level package it imports."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in run_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif node.module and node.level == 0:
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods
                         else node.module for a in node.names]
            else:
                names = []
            for name in names:
                target = resolve(name)
                if target and target != mod and target.split(".")[0] == mod.split(".")[0]:
                    graph[mod].add(target)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_package_has_an_import_cycle() -> None:
    """Over the namespace as one package (so no cycle between its layers either) and each
    package outside it."""
    outside = {layer for layer in ALLOWED if layer_dir(layer).parent == REPO}
    mods = modules(REPO, {NAMESPACE, *outside})
    assert {m.split(".")[0] for m in mods} == {NAMESPACE, *outside}
    assert len([m for m in mods if m.startswith(f"{NAMESPACE}.")]) > 100
    assert cycles(import_graph(mods)) == []


def test_the_check_sees_a_cycle_and_ignores_type_checking(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import x\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pkg import a\n")
    (pkg / "d.py").write_text("from pkg import c\n")
    graph = import_graph(modules(tmp_path, {"pkg"}))
    assert graph["pkg.c"] == set() and graph["pkg.d"] == {"pkg.c"}
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
