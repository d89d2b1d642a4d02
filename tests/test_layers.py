"""The layering of docs/architecture.md, checked on the code's own imports.

A package may import only the packages below it; an import that goes up or sideways (a
method importing the client app, the task importing the server) fails here, naming the file.
"""

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ALLOWED: dict[str, set[str]] = {
    # names and registries imported on first use: imports nothing of the project
    "lazy": set(),
    # everything that bends Flower and Ray: imports only them (a device's node runtime ships
    # it alone, beside fedinit/node/)
    "flower_compat": set(),
    "methods": {"lazy"},  # the pure rules: Flower's own functions, no patch layer
    "store": {"flower_compat"},
    "node": {"flower_compat"},
    # the data sets: one module each, where each is found and how it loads
    "data_sets": {"store", "lazy"},
    # the run config: typed groups checked against the method registry and the data sets
    "config": {"methods", "data_sets", "lazy"},
    "task": {"methods", "store", "flower_compat", "config", "data_sets"},
    # both halves run the SecAgg+ core's halves:
    # strategies/secure_upload.py (the client's, under method_train and the project's
    # ClientApp), strategies/round_stages/secure_sum.py
    # client_app/app.py reads the node's own slowdown factor (fedinit/node/slowdown.py) and
    # calls the strategies' client half (strategies/secure_upload.py)
    "client_app": {"task", "config", "data_sets", "methods", "store", "flower_compat",
                   "secure_aggregation", "node", "strategies"},
    # the project's experiment ServerApp over the strategies' round engine: data, central
    # evaluation, checkpoints, reports, tracking, the fleet's status
    "server_app": {"strategies", "task", "config", "data_sets", "methods", "store",
                   "flower_compat", "secure_aggregation"},
    # the commands a user runs (fedinit-simulate, -sweep, -report, -deploy, -dashboard)
    "cli": {"server_app", "client_app", "task", "config", "data_sets", "methods", "store",
            "flower_compat", "secure_aggregation", "node"},
    # the round engine (MethodStrategy, its stages, the schedules, the FedBuff loop), the
    # Flower Strategy classes over it, and their client half, which the project's ClientApp
    # calls too: under both apps, so it imports neither
    "strategies": {"task", "config", "data_sets", "methods", "store", "flower_compat",
                   "secure_aggregation"},
    # SecAgg+ protocol core (client and server halves): only Flower, numpy and flower_compat
    "secure_aggregation": {"flower_compat"},
}
APPS = set(ALLOWED)
# what tests and benchmarks both run against (the least-squares oracle, the fault app,
# runs on a local deployment): above every app package
ALLOWED["testbeds"] = APPS
# the benchmarks: anything but the tests (a helper both use lives in testbeds/)
ALLOWED["bench"] = APPS | {"testbeds"}
# the project's own tooling (setup, the docs' report builders, screenshots): over the
# commands it drives; nothing but the tests imports it
ALLOWED["scripts"] = APPS
PROJECT = {*ALLOWED, "tests"}
NAMESPACE = "fedinit"
"""The project's own namespace: every layer but the card's three packages and the
checkout-only ones (tests, bench, testbeds) lives under it."""


def layer_dir(layer: str) -> Path:
    """Where a layer's package sits: ``fedinit/<layer>`` or, for the others, ``<layer>``."""
    inside = REPO / NAMESPACE / layer
    return inside if (inside / "__init__.py").exists() else REPO / layer


def layer_of(module: str) -> str:
    """The layer a dotted module name belongs to (``fedinit.task.x`` -> ``task``)."""
    parts = module.split(".")
    return parts[1] if parts[0] == NAMESPACE and len(parts) > 1 else parts[0]


def project_imports(path: Path) -> set[str]:
    """The project's layers that ``path`` imports (TYPE_CHECKING ones too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {layer_of(alias.name) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(layer_of(node.module))
    return found & PROJECT


def test_each_package_imports_only_the_layers_below() -> None:
    wrong = []
    for package, allowed in ALLOWED.items():
        files = sorted(layer_dir(package).rglob("*.py"))
        assert files, package
        for path in files:
            extra = project_imports(path) - allowed - {package}
            if extra:
                wrong.append(f"{path.relative_to(REPO)} imports {sorted(extra)}")
    assert not wrong, "\n".join(wrong)


def test_every_top_level_package_is_covered() -> None:
    """A new package must get its row here (tests/ sits above all of them); the namespace
    holds packages only, and no ``__init__.py`` of its own."""
    packages = {p.parent.name for p in [*REPO.glob("*/__init__.py"),
                                        *(REPO / NAMESPACE).glob("*/__init__.py")]}
    assert packages - {"tests", NAMESPACE} == set(ALLOWED)
    # a namespace package: a device's node runtime and the app a run ships are portions of it
    assert sorted(p.name for p in (REPO / NAMESPACE).glob("*.py")) == []


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("from client_app.trainer import local_sgd\nimport numpy\n")
    assert project_imports(bad) == {"client_app"}


def test_cli_holds_the_users_commands_and_only_what_they_use() -> None:
    """Every ``[project.scripts]`` entry point is a ``fedinit/cli/`` module, and every
    ``fedinit/cli/`` module is reached from one (imported, or run as
    ``-m fedinit.cli.<name>``); project tooling that no command needs belongs in
    ``fedinit/scripts/``."""
    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    modules = {target.split(":")[0] for target in entry.values()}
    assert {m.rpartition(".")[0] for m in modules} == {"fedinit.cli"}, modules
    found = {p.stem for p in (REPO / "fedinit" / "cli").glob("*.py")} - {"__init__"}
    reached: set[str] = set()
    todo = [m.rpartition(".")[2] for m in modules]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        source = (REPO / "fedinit" / "cli" / f"{name}.py").read_text()
        todo += [m for m in found if re.search(rf"\bcli(\.| import ){m}\b", source)]
    assert found - reached == set(), \
        f"fedinit/cli/ modules no command uses: {sorted(found - reached)}"


CLIENT_ID_PACKAGES = ("strategies", "server_app", "client_app", "methods", "store", "task",
                      "config", "data_sets", "secure_aggregation")
"""The packages that speak of clients, never of processes: a client (partition) id is
``cid`` there; ``pid`` is a process id (the commands, the node runtime, the test tooling)."""


def test_pid_names_a_process_and_never_a_client() -> None:
    """One meaning per name: no ``pid`` or ``pids`` identifier in the client-speaking packages
    (attribute access like ``proc.pid`` is a process's, and allowed)."""
    import io
    import tokenize

    found = []
    for package in CLIENT_ID_PACKAGES:
        for path in sorted(layer_dir(package).rglob("*.py")):
            tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
            for prev, tok in zip([None, *tokens], tokens, strict=False):
                if (tok.type == tokenize.NAME and tok.string in ("pid", "pids")
                        and (prev is None or prev.string != ".")):
                    found.append(f"{path.relative_to(REPO)}:{tok.start[0]}")
    assert not found, found
