"""flower_compat: every guard passes on the installed flwr, every patch declines cleanly
(Flower's own behaviour, exactly one warning) when the source it checks differs, the docs'
table is the code's, and importing the project patches nothing."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from fedinit.flower_compat import guard, install
from fedinit.flower_compat.registry import KINDS, PATCHES, patch, table_markdown

REPO = Path(__file__).resolve().parents[1]


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture()
def warnings() -> Iterator[Warnings]:
    guard.forget()
    handler = Warnings()
    logging.getLogger("flwr").addHandler(handler)
    yield handler
    logging.getLogger("flwr").removeHandler(handler)
    guard.forget()


def test_every_guard_passes_against_the_installed_flwr() -> None:
    """If this fails after an upgrade, re-check that patch against the new source and
    re-measure it before recording the new hash (python -m fedinit.flower_compat --check)."""
    guard.forget()
    assert {p.name: guard.why_not(p.name) for p in PATCHES} == {p.name: None for p in PATCHES}
    for p in PATCHES:
        assert p.checked and set(p.kinds) <= set(KINDS), p.name
        assert (REPO / "fedinit" / "flower_compat" / f"{p.module}.py").is_file(), p.module
    assert len({p.name for p in PATCHES}) == len(PATCHES)


# ---------------------------------------------------------------- each patch, declined
def _fast_dispatch() -> None:
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    from fedinit.flower_compat import fast_dispatch

    state = InMemoryLinkState.__new__(InMemoryLinkState)
    state.lock, state.message_ins_store = threading.RLock(), {}
    assert fast_dispatch.apply(state) is False
    assert "get_message_ins" not in vars(state)  # Flower's own method


def _sim_window() -> None:
    from flwr.superlink.grid import InMemoryGrid

    from fedinit.flower_compat import sim_window

    grid = InMemoryGrid.__new__(InMemoryGrid)
    assert sim_window.wrap(grid) is grid  # Flower's grid, every message pushed at once


def _reply_poll() -> None:
    from fedinit.flower_compat import reply_poll

    grid = object()
    assert reply_poll.wrap(grid) is grid  # type: ignore[arg-type]


def _object_pulls() -> None:
    from flwr.supercore.inflatable import inflatable_utils
    from flwr.superlink.grid import http_grid
    from flwr.supernode import start_client_internal as loop

    from fedinit.flower_compat import object_pulls

    for module, name in ((loop, object_pulls.SUPERNODE), (http_grid, object_pulls.SERVERAPP)):
        assert object_pulls.apply(name) is False
        assert module.pull_objects is inflatable_utils.pull_objects


def _supernode_waits() -> None:
    import time

    from flwr.supernode import start_client_internal as loop

    from fedinit.flower_compat import supernode_waits

    poll = supernode_waits.AdaptivePoll(fast=0.2, idle=3, window=30, reply=0.05)
    assert supernode_waits.apply(poll) is False
    assert loop.time is time


def _warm_executor() -> None:
    from fedinit.node.launch import chosen_executor

    assert chosen_executor("warm") == "flower"  # Flower's flower-superexec
    assert chosen_executor("flower") == "flower"


def _app_allowlist() -> None:
    from flwr.supernode import start_client_internal as loop

    from fedinit.flower_compat import app_allowlist
    from fedinit.node.app_allowlist import Allowlist

    original = loop._pull_and_store_message
    assert app_allowlist.apply(Allowlist(REPO / "approved-apps.txt")) is False
    assert loop._pull_and_store_message is original  # Flower's own, storing any FAB


def _reply_order() -> None:
    from flwr.supernode import start_client_internal as loop

    from fedinit.flower_compat import reply_order

    pull, push = loop._pull_and_store_message, loop._push_messages
    assert reply_order.apply() is False
    assert (loop._pull_and_store_message, loop._push_messages) == (pull, push)  # Flower's


def _ray_inline() -> None:
    from fedinit.flower_compat import ray_inline

    # only the patch's own variable is compared: the guard's first read imports Ray and gRPC,
    # which set their own (RAY_CLIENT_MODE, GRPC_VERBOSITY) in a process that had not yet
    before = os.environ.get(ray_inline.INLINE_LIMIT_ENV)
    original = ray_inline.loaded_by_engine
    ray_inline.loaded_by_engine = lambda: True  # as if Flower's engine were loading the app
    try:
        assert ray_inline.apply() is False
    finally:
        ray_inline.loaded_by_engine = original
    assert os.environ.get(ray_inline.INLINE_LIMIT_ENV) == before  # Ray's own 100 KiB limit


def _app_source() -> None:
    from fedinit.flower_compat.app_source import app_files, staged_app

    assert app_files(REPO) is None
    with staged_app(REPO) as app:
        assert app == REPO  # flwr run builds from the checkout, as Flower does


def _offline_env() -> None:
    from fedinit.flower_compat import offline_env

    assert offline_env.offline({"A": "1"}) == {"A": "1"}


def _ray_loopback() -> None:
    from fedinit.flower_compat import offline_env

    assert offline_env.loopback({"A": "1"}) == {"A": "1"}


def _flower_helpers() -> None:
    from flwr.serverapp.strategy.fedtrimmedavg import trim_mean

    from fedinit.flower_compat import flower_helpers
    from fedinit.methods import robust

    assert flower_helpers.check() is False  # declined: warned, and the rules still compute
    x = np.arange(20, dtype=np.float64).reshape(10, 2) ** 2
    got = robust.trimmed_mean([[row] for row in x], 0.2)[0]
    np.testing.assert_array_equal(got, trim_mean(x, 0.2).astype(np.float32))


DECLINED: dict[str, Callable[[], None]] = {
    "fast-dispatch": _fast_dispatch, "sim-window": _sim_window, "reply-poll": _reply_poll,
    "object-pulls": _object_pulls, "supernode-waits": _supernode_waits,
    "warm-executor": _warm_executor, "reply-order": _reply_order,
    "app-allowlist": _app_allowlist,
    "ray-inline": _ray_inline, "app-source": _app_source,
    "offline-env": _offline_env, "ray-loopback": _ray_loopback,
    "flower-helpers": _flower_helpers,
}


def test_every_patch_has_a_decline_check() -> None:
    assert set(DECLINED) == {p.name for p in PATCHES}


@pytest.mark.parametrize(("name", "target"),
                         [(p.name, t) for p in PATCHES for t, _ in p.checked])
def test_a_changed_source_declines_cleanly(name: str, target: str, warnings: Warnings,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each text a guard reads, changed by one comment: the patch declines, Flower's own
    behaviour stays, one warning names the patch and the target, nothing raises."""
    read = guard.source_of
    monkeypatch.setattr(guard, "source_of",
                        lambda t: read(t) + ("# changed\n" if t == target else ""))
    DECLINED[name]()
    DECLINED[name]()  # asked again in the same process: no second warning
    ours = [m for m in warnings.messages if "flower_compat" in m]
    assert len(ours) == 1, ours
    assert name in ours[0] and target in ours[0] and patch(name).declined in ours[0]


def test_another_flower_declines_every_patch(warnings: Warnings,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import flwr

    monkeypatch.setattr(flwr, "__version__", "1.40.0")
    for p in PATCHES:
        assert guard.why_not(p.name) == "flwr 1.40.0 is not the checked 1.39.0"
        DECLINED[p.name]()
    assert len([m for m in warnings.messages if "flower_compat" in m]) == len(PATCHES)


# ---------------------------------------------------------------- install per process kind
def test_install_names_the_kinds_it_allows() -> None:
    with pytest.raises(ValueError, match="kind 'client' is not allowed; allowed: "
                                         "simulation-engine, serverapp, supernode"):
        install("client")
    with pytest.raises(ValueError, match="needs grid="):
        install("serverapp")


def test_the_serverapp_install_wraps_the_simulation_grid(warnings: Warnings) -> None:
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid

    from fedinit.flower_compat.sim_window import WindowedSimGrid

    grid = InMemoryGrid(LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(),
                                         ObjectStoreFactory()))
    done = install("serverapp", grid=grid, simulation=True)
    assert done.applied == ["fast-dispatch", "sim-window"] and not done.declined
    assert isinstance(done.grid, WindowedSimGrid) and done.grid.state is grid.state
    assert "get_message_ins" in vars(grid.state)
    assert "get_message_ins" not in vars(InMemoryLinkState.__new__(InMemoryLinkState))
    assert not warnings.messages


# ---------------------------------------------------------------- the docs' table
def test_the_docs_table_is_the_registry() -> None:
    """docs/flower_compat.md holds ``python -m fedinit.flower_compat``'s table between its
    markers."""
    doc = (REPO / "docs" / "flower_compat.md").read_text()
    begin, end = "<!-- patches:begin -->\n", "<!-- patches:end -->"
    assert doc.count(begin) == 1 and doc.count(end) == 1
    assert doc.split(begin)[1].split(end)[0] == table_markdown()
    assert f"flwr {guard.CHECKED_FLWR}" in doc


# ---------------------------------------------------------------- no import side effects
SNAPSHOT = """
import importlib, json, os, sys
def patched():
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.superlink.grid import http_grid, inmemory_grid
    from flwr.supernode import start_client_internal as loop
    return {"loop.time": repr(loop.time), "loop.pull_objects": repr(loop.pull_objects),
            "loop._push_messages": repr(loop._push_messages),
            "loop._pull_and_store_message": repr(loop._pull_and_store_message),
            "http_grid.pull_objects": repr(http_grid.pull_objects),
            "get_message_ins": repr(InMemoryLinkState.get_message_ins),
            "InMemoryGrid.send_and_receive": repr(inmemory_grid.InMemoryGrid.send_and_receive),
            "HttpGrid.send_and_receive": repr(http_grid.HttpGrid.send_and_receive)}
import torch, ray, flwr.simulation, flwr.clientapp, flwr.serverapp  # their own env changes
env, flower = dict(os.environ), patched()
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as err:  # reported: every module must import
        failed[name] = repr(err)
changed = sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k))
print(json.dumps({"env": changed, "flower": [k for k, v in patched().items()
                                             if flower[k] != v], "failed": failed}))
"""


def project_modules() -> list[str]:
    """Every module of every top-level package (and of every package in the ``fedinit``
    namespace) but tests/ and bench/, and not __main__."""
    names = []
    for init in sorted([*REPO.glob("*/__init__.py"), *REPO.glob("fedinit/*/__init__.py")]):
        package = init.parent
        if package.name in ("tests", "bench"):
            continue
        for path in sorted(package.rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            if rel.name != "__main__":
                names.append(".".join(rel.parts).removesuffix(".__init__"))
    return names


@pytest.mark.slow  # a fresh interpreter importing torch and the apps: 11-23 s
def test_importing_every_project_module_changes_no_environment_and_patches_nothing() -> None:
    modules = project_modules()
    assert "fedinit.flower_compat.installer" in modules and "client_app.app" in modules
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    out = subprocess.run([sys.executable, "-c", SNAPSHOT, *modules], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found == {"env": [], "flower": [], "failed": {}}
