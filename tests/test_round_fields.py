"""Round-row column names have one source: what the shell returns lands in every row."""

import json
from pathlib import Path

import pytest

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from server_app.experiment import run_experiment
from server_app.results import ROUND_FIELDS

pytestmark = pytest.mark.usefixtures("quick_runs")

SMALL = {"num-clients": 3, "num-server-rounds": 2, "train-limit": 150, "local-epochs": 1,
         "batch-size": 50}


def test_every_shell_metric_is_a_column_and_filled(tmp_path: Path) -> None:
    raw = {**SMALL, "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    run_experiment(InProcessGrid(3, raw), cfg, out_dir=tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text()
            .splitlines()]
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert tuple(row) == ROUND_FIELDS
        assert all(row[key] is not None for key in rk.SHELL_METRICS), row
        assert row[rk.NUM_REPLIES] == cfg.clients_per_round
