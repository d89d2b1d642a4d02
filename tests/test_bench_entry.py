"""Every bench runs as ``python -m bench.<name>`` from the checkout, and no module puts the
repository on ``sys.path`` by hand (the package layout and ``python -m`` do that)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIBRARIES = ("plain_loop", "cost_runs")
"""Bench modules that other benches (or tests) import, with no command of their own."""
PACKAGES = ("bench", "client_app", "fedinit", "server_app", "strategies", "testbeds", "tests")


def sys_path_edits(source: str) -> list[int]:
    """Lines that change ``sys.path`` (a call on it, or an assignment to it)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
        elif isinstance(node, ast.Assign | ast.AugAssign):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
        if (isinstance(target, ast.Attribute) and target.attr == "path"
                and isinstance(target.value, ast.Name) and target.value.id == "sys"):
            lines.append(node.lineno)
    return lines


def test_no_module_edits_sys_path() -> None:
    assert all(any((REPO / package).rglob("*.py")) for package in PACKAGES)  # none vacuous
    found = [f"{path.relative_to(REPO)}:{line}" for package in PACKAGES
             for path in sorted((REPO / package).rglob("*.py"))
             for line in sys_path_edits(path.read_text())]
    assert not found, "sys.path edited by hand: " + ", ".join(found)


def test_the_check_sees_an_edit() -> None:
    assert sys_path_edits("import sys\nsys.path.insert(0, 'x')\n") == [2]
    assert sys_path_edits("import sys\nsys.path += ['x']\n") == [2]
    assert sys_path_edits("import sys\nprint(sys.path)\n") == []


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "bench").glob("*.py")
                                        if p.stem != "__init__"))
def test_every_bench_imports_as_a_module(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    text = (REPO / "bench" / f"{name}.py").read_text()
    assert name in LIBRARIES or 'if __name__ == "__main__":' in text, module
    assert f"bench/{name}.py " not in text.split('"""')[1], "usage should say -m bench." + name
