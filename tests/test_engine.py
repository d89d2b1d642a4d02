"""The round engine (``strategies/engine.py``): one loop for every schedule.

A schedule's steps reach the caller in order, each before anything of the next is made; a
caller's True ends the run there and closes the schedule, so nothing of a next step is sent:
checked on a hand-written schedule, and through the project's experiment under both
schedules, where the grid's record of what was sent is the witness."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from flwr.app import MessageType

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from server_app.experiment import run_experiment
from strategies.engine import Step, Steps, run_steps

pytestmark = pytest.mark.usefixtures("quick_runs")

SMALL = {"num-clients": 4, "fraction-train": 0.5, "num-server-rounds": 5, "train-limit": 800,
         "local-epochs": 1, "personal-eval-every": 0, "eval-every": 5}


def counted(made: list[int], closed: list[bool], n: int) -> Steps:
    """A schedule of ``n`` steps that records each step it makes, and its close."""
    try:
        for k in range(1, n + 1):
            made.append(k)
            yield Step(k, fields={"k": k}, detail=None)
    finally:
        closed.append(True)


def test_steps_reach_the_caller_in_order_each_after_it_is_made() -> None:
    made: list[int] = []
    closed: list[bool] = []
    seen: list[tuple[int, list[int]]] = []
    t0 = time.monotonic()
    began: list[float] = []

    def on_step(step: Step, when: float) -> bool:
        seen.append((step.number, list(made)))
        began.append(when)
        return False

    assert run_steps(counted(made, closed, 3), on_step) == 3
    assert seen == [(1, [1]), (2, [1, 2]), (3, [1, 2, 3])]  # never a step ahead
    assert t0 <= began[0] <= began[1] <= began[2] <= time.monotonic()
    assert closed == [True]


def test_a_callers_true_ends_the_run_and_closes_the_schedule() -> None:
    made: list[int] = []
    closed: list[bool] = []
    ran = run_steps(counted(made, closed, 10), lambda step, _: step.number == 2)
    assert ran == 2 and made == [1, 2] and closed == [True]


def test_a_held_step_is_one_without_a_model() -> None:
    assert Step(1, detail=None).held
    assert not Step(1, weights=[], detail=None).held


def _train_sent(grid: InProcessGrid) -> int:
    return sum(m.metadata.message_type == MessageType.TRAIN for m in grid.sent)


def test_the_experiments_stop_sends_nothing_of_the_next_round(tmp_path: Path) -> None:
    """rounds=sync: stopped after round 2 of 5, the grid saw two rounds' train messages
    (2 clients each) and the rows and checkpoint end at round 2."""
    cfg = RunConfig.parse({**SMALL, "output-dir": str(tmp_path)})
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
    run_experiment(grid, cfg, out_dir=tmp_path / "run", stop=lambda row: row["round"] == 2)
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text()
            .splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert _train_sent(grid) == 4


def test_the_async_stop_sends_nothing_of_the_next_version(tmp_path: Path) -> None:
    """rounds=async: stopped at version 2, every train message the grid saw is counted in
    that flush's ``dispatched``: no task of version 3 went out."""
    keys: dict[str, Any] = {**SMALL, "rounds": "async", "concurrency": 2,
                            "buffer-size": 2, "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(keys)
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
    run_experiment(grid, cfg, out_dir=tmp_path / "run", stop=lambda row: row["round"] == 2)
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text()
            .splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[-1]["dispatched"] == _train_sent(grid)
    assert _train_sent(grid) == 4 + rows[-1]["in-flight"]
