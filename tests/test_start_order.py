"""The server's cheap checks come first: a missing data set or a wrong-sized federation
fails before the data is decoded, and `results: <dir>` is printed only for a run that starts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import server_app.experiment as experiment
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.task.data_paths import DataNotFoundError
from server_app.clients import FederationError


def config(tmp: Path, **over: Any) -> RunConfig:
    return RunConfig.parse({"num-clients": 4, "fraction-train": 0.5, "num-server-rounds": 1,
                            "train-limit": 400, "output-dir": str(tmp / "out"), **over})


@pytest.fixture
def logged(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    lines: list[str] = []
    monkeypatch.setattr(experiment, "log", lambda _lvl, fmt, *a: lines.append(fmt % a))
    return lines


def test_missing_data_fails_before_waiting_for_nodes(tmp_path: Path, logged: list[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config(tmp_path, dataset="cifar10", **{"data-dir": str(tmp_path / "none")})
    grid = InProcessGrid(4, cfg.to_dict())
    monkeypatch.setattr(grid, "get_node_ids", lambda: pytest.fail("waited for nodes"))
    with pytest.raises(DataNotFoundError, match="cifar10 not found"):
        experiment.run_experiment(grid, cfg)
    assert not any(line.startswith("results:") for line in logged)


def test_wrong_federation_fails_before_the_data_is_loaded(tmp_path: Path, logged: list[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # node-wait-timeout short: the grid has 3 of 4 nodes, so discovery waits all of it.
    cfg = config(tmp_path, **{"node-wait-timeout": 1.0})
    loaded_by: list[str] = []  # the warm-up thread may decode early; the run itself must not
    monkeypatch.setattr(experiment, "dataset_of",
                        lambda _c: loaded_by.append(threading.current_thread().name))
    with pytest.raises(FederationError, match="num-supernodes=4"):
        experiment.run_experiment(InProcessGrid(3, cfg.to_dict()), cfg)
    assert threading.main_thread().name not in loaded_by
    assert not any(line.startswith("results:") for line in logged)
