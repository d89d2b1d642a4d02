"""Shared fixtures: an isolated Flower home + local SuperLink ports for `flwr run` tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from fedinit.cli.flower_env import flower_env
from tests.slow_groups import SIM_PORT_BASE, SLOW_MODULES, group_seconds, sim_ports

if TYPE_CHECKING:
    from fedinit.config import RunConfig
    from fedinit.data_sets.spec import DataSplits

# Private local SuperLink ports for the tests' `flwr run`s; FEDINIT_TEST_*_PORT move them when
# several checkouts test on one machine, and each pytest-xdist worker adds its own offset
# (tests/slow_groups.py) so that two workers' `flwr run`s never share a SuperLink.
_SIM_PORTS = sim_ports(os.environ.get("PYTEST_XDIST_WORKER", ""),
                       (int(os.environ.get("FEDINIT_TEST_HTTP_PORT", SIM_PORT_BASE[0])),
                        int(os.environ.get("FEDINIT_TEST_CONTROL_PORT", SIM_PORT_BASE[1]))))
SIM_HTTP_PORT, SIM_CONTROL_PORT = (str(p) for p in _SIM_PORTS)


def free_ports(n: int) -> list[int]:
    """n distinct free ports: every socket stays bound until all are chosen.

    Binding and closing one socket at a time can hand the same port out twice (the kernel
    reuses the lowest free ephemeral port, and scripts/test.sh reserves 39000-44999 below
    it): Ray then refuses to start ("port 45001 that is used by other components").
    """
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]


def kill_local_superlink(port: str) -> None:
    """The managed local SuperLink outlives `flwr run`; stop the one on our test port."""
    out = subprocess.run(["pgrep", "-f", f"flower-superlink.*--port {port}"],
                         capture_output=True, text=True, check=False).stdout
    for pid in out.split():
        try:
            os.killpg(int(pid), signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGTERM)


def pytest_configure(config: pytest.Config) -> None:
    """The in-process runs train tiny CNNs: on one intra-op thread they take a third of the
    CPU time they take on two spinning ones (measured 5.5 s against 19.7 s for one test on
    2 busy cores). Subprocesses (flwr run, Ray) keep their own settings.

    Under CI, a skip for want of what the CI machine provides fails (tests/ci_skips.py)."""
    import torch

    from tests import ci_skips

    torch.set_num_threads(1)
    if not config.pluginmanager.is_registered(ci_skips):
        config.pluginmanager.register(ci_skips, "ci-skips")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Each slow module's tests join its xdist group (tests/slow_groups.py: tests sharing a
    port range or Docker never run at once under ``--dist loadgroup``), and those of a module
    that must run alone are marked ``alone`` (and ``solitary``). At collection, before any
    ``pytest_collection_modifyitems`` (xdist's reads the groups, ``-m`` the marks)."""
    slow = SLOW_MODULES.get(item.path.stem)
    if slow is not None:
        item.add_marker(pytest.mark.xdist_group(slow.group))
        if slow.alone:
            item.add_marker(pytest.mark.alone)
        if slow.solitary:
            item.add_marker(pytest.mark.solitary)


def slow_group_of(nodeid: str) -> str:
    """The xdist scope of a test under ``--dist loadgroup``: its module's group in
    tests/slow_groups.py, or the test itself (spread freely) for a module not listed."""
    module = Path(nodeid.split("::", 1)[0]).stem
    slow = SLOW_MODULES.get(module)
    return slow.group if slow is not None else nodeid


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """``--dist loadgroup`` by tests/slow_groups.py. xdist 3.8's own loadgroup never groups
    under pytest 9.2: it renames ``item._nodeid`` to ``<nodeid>@<group>``, but pytest 9.2
    keeps the id in ``item._id``, so every test went alone, as under ``--dist load`` (found
    2026-12-03). Its scope scheduler with our scope of each test does what loadgroup meant:
    a group's tests on one worker, one at a time."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SlowGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return slow_group_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            """The longest group waiting first (xdist orders them by test count): a long
            group started last would run alone at the end."""
            longest = max(self.workqueue, key=group_seconds)  # ties: xdist's order
            self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

    return SlowGroupScheduling(config, log)  # type: ignore[arg-type]


SMALL_TEST_SET = 1000
"""Central test examples the in-process runs of ``small_central_test_set`` score on."""


LOG_TAIL_LINES = 30
"""Lines of each process log a failed deployment test reports."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    """A failed test that used a deployment reports the end of each of its process logs
    (SuperLink, SuperNodes, runs): a node's log is the only record of what it was doing,
    and a CI failure is otherwise read without it."""
    report = yield
    if report.failed and call.when in ("call", "teardown"):
        funcargs = getattr(item, "funcargs", {})
        for value in funcargs.values():
            logs = getattr(value, "logs", None)
            if isinstance(logs, Path) and logs.is_dir():
                for log in sorted(logs.glob("*.log")):
                    lines = [ln for ln in log.read_text(errors="replace").splitlines()
                             if ln.split(":", 3)[-1].strip()]  # not Flower's empty lines
                    tail = lines[-LOG_TAIL_LINES:]
                    report.sections.append((f"deployment log {log.name}", "\n".join(tail)))
    return report


@pytest.fixture(scope="module")
def small_central_test_set() -> Iterator[None]:
    """Central evaluation on the first ``SMALL_TEST_SET`` examples of the test split.

    Scoring the whole split (10,000 Fashion-MNIST images) each round was most of an
    in-process run's time; tests that compare runs with each other (resume, faults,
    state) score every run on the same images, so they prove the same on fewer. Module
    scope, so that a module's own shared runs (module fixtures) score on the same images.
    """
    import dataclasses

    import server_app.central_eval as central_eval

    real = central_eval.dataset_of

    def first_examples(cfg: RunConfig) -> DataSplits:
        data = real(cfg)
        return dataclasses.replace(data, test_x=data.test_x[:SMALL_TEST_SET],
                                   test_y=data.test_y[:SMALL_TEST_SET])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(central_eval, "dataset_of", first_examples)
        yield


@pytest.fixture(scope="module")
def quick_runs(small_central_test_set: None) -> Iterator[None]:
    """``small_central_test_set``, and runs that draw no accuracy.png / divergence.png.

    Two matplotlib figures cost 0.25 s of CPU per run, about a third of what a tiny
    in-process run still took; tests that assert nothing about the plots skip them.
    tests/test_personal_eval.py (not on this fixture) checks every plot is written.
    """
    del small_central_test_set
    from server_app.results import Recorder

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Recorder, "plot", lambda self: None)
        yield


class FakeClock:
    """``monotonic`` and ``sleep`` for code whose waits the tests only need to run out:
    ``sleep`` moves the clock on at once. ``time`` stays the wall clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    @staticmethod
    def time() -> float:
        import time

        return time.time()


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The node discovery's clock (server_app/clients.py) made a FakeClock: a test whose
    nodes never all identify waits out node-wait-timeout without sleeping through it."""
    import server_app.clients as clients

    clock = FakeClock()
    monkeypatch.setattr(clients, "time", clock)
    return clock


@pytest.fixture(scope="session")
def sim_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Environment for `flwr run` simulations on private ports, torn down after the session."""
    home = tmp_path_factory.mktemp("flwr-home")
    env = flower_env(Path(home), FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=SIM_HTTP_PORT,
                     FLWR_LOCAL_CONTROL_API_PORT=SIM_CONTROL_PORT)
    kill_local_superlink(SIM_HTTP_PORT)
    yield env
    kill_local_superlink(SIM_HTTP_PORT)


def simulation_pids() -> list[int]:
    """The ServerApp's process of a ``sim_env`` simulation is ``flwr-simulation`` (server and
    clients)."""
    found = subprocess.run(["pgrep", "-f", f"flwr-simulation.*{SIM_HTTP_PORT}"],
                           capture_output=True, text=True, check=False).stdout
    return [int(p) for p in found.split()]


def kill_simulation_at(out: Path, rows: int, what: str) -> Path:
    """SIGKILLs the ``flwr-simulation`` processes once the run writing under ``out`` has
    ``rows`` rows (``what``: "round", "version") in its rounds.jsonl; that file."""
    deadline = time.monotonic() + 300
    rows_file = None
    while time.monotonic() < deadline and rows_file is None:
        found = list(out.glob("*/rounds.jsonl"))
        if found and len(found[0].read_text().splitlines()) >= rows:
            rows_file = found[0]
        else:
            time.sleep(0.05)
    assert rows_file is not None, f"the run never reached {what} {rows}"
    pids = simulation_pids()
    assert pids, "no flwr-simulation process to kill"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return rows_file


@pytest.fixture
def serverapp_without_patches(monkeypatch: pytest.MonkeyPatch) -> None:
    """``server_app.app.main`` on a test grid without ``flower_compat.install``: installing
    patches Flower for the whole process (the deployment grid's object pulls), which would
    leak into every later test of the worker (tests/test_flower_compat.py checks Flower's
    own behaviour)."""
    from types import SimpleNamespace

    import server_app.app as app_module

    monkeypatch.setattr(app_module, "install",
                        lambda kind, *, grid, simulation=False: SimpleNamespace(grid=grid))


@pytest.fixture(scope="session")
def another_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A fresh interpreter's split digest, regimes and label digest (tests/another_process.py)
    for tests/test_local_split.py's RUN and tests/test_regimes.py's PERMUTED, computed once per
    session: under pytest-xdist the workers' temporary folders share a parent of this
    session's own."""
    from tests.another_process import shared
    from tests.test_local_split import RUN
    from tests.test_regimes import PERMUTED

    base = tmp_path_factory.getbasetemp()
    return shared(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base,
                  RUN, PERMUTED)
