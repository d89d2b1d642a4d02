"""status.json's ``connected`` is the fleet's last ``get_node_ids`` answer, which the rounds
ask for anyway: a write asks the SuperLink nothing (the call was 18-24 ms of a 50-71 ms write
with 1000 nodes in SQLite, bench/dashboard_scrape.py --table write), and the page is at most
one round old."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from server_app import clients
from server_app.clients import Fleet
from server_app.experiment import run_experiment
from server_app.status import STATUS_FILE, StatusWriter
from tests.test_fleet import SMALL

pytestmark = pytest.mark.usefixtures("quick_runs")


class CountingGrid:
    """Answers ``get_node_ids`` with ``nodes`` and counts the calls (nothing else is used)."""

    def __init__(self, nodes: Iterable[int]) -> None:
        self.nodes = set(nodes)
        self.asked = 0

    def get_node_ids(self) -> list[int]:
        self.asked += 1
        return sorted(self.nodes)


def nodes_of(run_dir: Path) -> dict[int, dict[str, Any]]:
    status = json.loads((run_dir / STATUS_FILE).read_text())
    return {n["node"]: n for n in status["fleet"]["nodes"]}


def test_writes_ask_nothing_and_show_the_rounds_last_answer(tmp_path: Path) -> None:
    grid = CountingGrid({1000, 1001, 1002})
    fleet = Fleet(grid, RunConfig.parse({"num-clients": 3}))  # type: ignore[arg-type]
    fleet.node_of = {0: 1000, 1: 1001, 2: 1002}
    writer = StatusWriter(tmp_path, fleet.cfg, fleet, 1)
    fleet.online()  # round 1's own question (Fleet.ask)
    asked_at = time.time()
    for _ in range(50):
        writer.write()
    writer.finish()
    assert grid.asked == 1
    nodes = nodes_of(tmp_path)
    assert [nodes[n]["connected"] for n in (1000, 1001, 1002)] == [True, True, True]
    grid.nodes.discard(1001)  # the SuperLink drops it: the page says so once a round asks
    writer.write()
    assert nodes_of(tmp_path)[1001]["connected"] is True and grid.asked == 1
    fleet.online()  # round 2's question
    writer.write()
    nodes = nodes_of(tmp_path)
    assert nodes[1001]["connected"] is False and nodes[1000]["connected"] is True
    assert nodes[1001]["last-connected"] <= asked_at < nodes[1000]["last-connected"]
    assert grid.asked == 2


class CountingInProcessGrid(InProcessGrid):
    """The in-process fleet, counting the ServerApp's ``get_node_ids`` calls."""

    asked = 0

    def get_node_ids(self) -> Iterable[int]:
        self.asked += 1
        return super().get_node_ids()


def test_a_runs_status_writes_add_no_get_node_ids_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same 3-round run with status writes and with them switched off asks the SuperLink
    the same number of times; the file is written (at least once a round) all the same."""
    raw = {**SMALL, "num-server-rounds": 3, "output-dir": str(tmp_path)}
    writes = [0]
    real_write = StatusWriter.write

    def counted(self: StatusWriter) -> None:
        writes[0] += 1
        real_write(self)

    monkeypatch.setattr(StatusWriter, "write", counted)
    with_status = CountingInProcessGrid(3, raw)
    run_experiment(with_status, RunConfig.parse(raw), out_dir=tmp_path / "a")
    assert writes[0] >= 3 + 2  # the start, each round, the end
    assert all(n["connected"] for n in nodes_of(tmp_path / "a").values())
    monkeypatch.setattr(StatusWriter, "write", lambda self: None)
    without = CountingInProcessGrid(3, raw)
    run_experiment(without, RunConfig.parse(raw), out_dir=tmp_path / "b")
    assert with_status.asked == without.asked > 0


def test_a_simulation_says_its_nodes_are_connected_from_the_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's nodes never miss a heartbeat: asked once, at discovery."""
    grid = CountingGrid({7, 8})
    fleet = Fleet(grid, RunConfig.parse({"num-clients": 2}))  # type: ignore[arg-type]
    fleet.simulated = True
    monkeypatch.setattr(clients, "_simulated_clients", lambda grid, cfg: {0: 7, 1: 8})
    assert fleet.discover() == {0: 7, 1: 8}
    assert fleet.connected == {7, 8} and set(fleet.connected_at) == {7, 8}
    assert grid.asked == 1


def test_the_write_bench_prints_before_and_after_for_each_fleet_and_state(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.dashboard_scrape import main

    assert main(["--table", "write", "--nodes", "3", "5", "--rounds", "2", "--repeat", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()[2:]
    assert [line.split()[:2] for line in lines] == [
        ["3", "memory"], ["3", "sqlite"], ["5", "memory"], ["5", "sqlite"]]
    for line in lines:
        ask, before, after, ratio = (float(x.rstrip("x")) for x in line.split()[2:])
        assert ask > 0 and after > 0 and ratio == pytest.approx(before / after, rel=0.1)
