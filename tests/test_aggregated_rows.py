"""Which rows aggregated has one source, the Recorder's rows: a row's ``aggregated`` flag,
the kept rows of a resumed run included, so a secure run (whose rows carry no train loss and
no divergence) resumed into rounds that all fail ends normally, and a run where no round ever
aggregated still stops with NothingTrained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Message, MessageType

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from server_app.results import AGGREGATED, Recorder, was_aggregated
from server_app.run_basics import NothingTrained
from tests.test_secagg_run import BASE

pytestmark = pytest.mark.usefixtures("quick_runs")

MODES = {"sync": {}, "secure": {"secure-aggregation": "secagg+"}}


def no_train_replies(reply: Message) -> Message | None:
    """Every train reply lost (setup and identity queries still answered): no round has a
    usable reply, so none aggregates."""
    return None if reply.metadata.message_type == MessageType.TRAIN else reply


def run(raw: dict[str, Any], out: Path, *, fail: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    grid = InProcessGrid(4, raw)
    if fail:
        grid.reply_filter = no_train_replies
    return run_experiment(grid, RunConfig.parse(raw), out_dir=out)


def test_the_flag_decides_and_rows_before_it_count_by_their_figures(tmp_path: Path) -> None:
    secure_kept = [{"round": 1, "num-replies": 4, AGGREGATED: True, "elapsed-seconds": 1.0},
                   {"round": 2, "num-replies": 4, AGGREGATED: False, "elapsed-seconds": 2.0}]
    rec = Recorder(tmp_path / "a", {}, keep_rounds=2, rows=secure_kept)
    assert rec.aggregated_rounds() == 1
    rec.add_round({"round": 3, "num-replies": 1, AGGREGATED: False})
    assert rec.aggregated_rounds() == 1
    older = [{"round": 1, "train-loss": 0.7}, {"round": 2, "divergence": 0.1},
             {"round": 3, "num-replies": 4, "elapsed-seconds": 3.0}]  # before the flag
    assert [was_aggregated(r) for r in older] == [True, True, False]
    assert Recorder(tmp_path / "b", {}, keep_rounds=3, rows=older).aggregated_rounds() == 2


@pytest.mark.parametrize("mode", list(MODES))
def test_a_run_whose_rounds_all_fail_after_a_resume_ends_normally(
        tmp_path: Path, mode: str) -> None:
    """Two aggregated rounds, then a resume to round 3 whose train replies are all lost: the
    kept rows say the model was trained, so the run writes its results (the model is
    round 2's) instead of stopping with NothingTrained."""
    raw = {**BASE, **MODES[mode], "output-dir": str(tmp_path)}
    run(raw, tmp_path / "run", fail=False)
    trained = load_checkpoint(tmp_path / "run").weights
    summary = run({**raw, "num-server-rounds": 3, "resume-dir": str(tmp_path / "run")},
                  tmp_path / "ignored", fail=True)
    ckpt = load_checkpoint(tmp_path / "run")
    assert [r[AGGREGATED] for r in ckpt.rows] == [True, True, False]
    assert [r["num-replies"] for r in ckpt.rows] == [4, 4, 0]
    if mode == "secure":  # what the rows held before the flag: nothing to count them by
        assert all(r["train-loss"] is None and r["divergence"] is None for r in ckpt.rows)
    assert summary["rounds"] == 3 and (tmp_path / "run" / "model.pt").exists()
    with np.load(tmp_path / "run" / "final_model.npz") as final:
        assert all(np.array_equal(final[f"arr_{i}"], w) for i, w in enumerate(trained))


@pytest.mark.parametrize("mode", list(MODES))
def test_a_run_where_no_round_ever_aggregated_stops_with_nothing_trained(
        tmp_path: Path, mode: str) -> None:
    raw = {**BASE, **MODES[mode], "num-server-rounds": 2, "output-dir": str(tmp_path)}
    with pytest.raises(NothingTrained, match="no round of the run aggregated a reply"):
        run(raw, tmp_path / "run", fail=True)
    rows = load_checkpoint(tmp_path / "run").rows
    assert [r[AGGREGATED] for r in rows] == [False, False]
    assert not (tmp_path / "run" / "model.pt").exists()
