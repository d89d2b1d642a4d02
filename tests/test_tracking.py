"""TensorBoard tracking: every number of every row lands in the event files with its value
(read back with TensorBoard's own reader), a resumed run holds each round once, and the
per-client accuracies are distributions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import ConfigError, RunConfig
from server_app.experiment import run_experiment
from server_app.results import Recorder
from server_app.tracking import EVENTS_DIR, TrackingUnavailable, check_available, tag_of

pytestmark = pytest.mark.usefixtures("quick_runs")

SMALL = {"num-clients": 4, "fraction-train": 0.5, "num-server-rounds": 3, "train-limit": 800,
         "local-epochs": 1, "personal-eval-every": 2, "local-test-fraction": 0.2,
         "eval-every": 1, "beta": 0.1}


def read_events(run_dir: Path) -> EventAccumulator:
    events = EventAccumulator(str(run_dir / EVENTS_DIR), size_guidance={"scalars": 0,
                                                                         "histograms": 0})
    events.Reload()
    return events


def scalars(events: EventAccumulator) -> dict[str, dict[int, float]]:
    return {tag: {e.step: e.value for e in events.Scalars(tag)}
            for tag in events.Tags()["scalars"]}


def expected(rows: list[dict[str, Any]]) -> dict[str, dict[int, float]]:
    """Every numeric column of rounds.jsonl by tag and round, as TensorBoard stores it
    (float32), computed from the rows alone."""
    out: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in row.items():
            if key == "round" or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            out.setdefault(tag_of(key), {})[row["round"]] = float(np.float32(value))
    return out


def test_a_run_writes_every_numeric_column_of_its_rows(tmp_path: Path) -> None:
    cfg = RunConfig.parse({**SMALL, "output-dir": str(tmp_path)})
    run_dir = tmp_path / "run"
    run_experiment(InProcessGrid(cfg.num_clients, cfg.to_dict()), cfg, out_dir=run_dir)
    rows = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    want = expected(rows)
    assert {"eval/test-acc", "train/train-loss", "time/round-seconds"} <= set(want)
    events = read_events(run_dir)
    assert scalars(events) == want
    # the config as hyperparameters, and round 2's personalized accuracies per client
    assert events.PluginTagToContent("hparams")
    hist = events.Histograms("clients/acc-global")
    assert [h.step for h in hist] == [2] and hist[0].histogram_value.num == 4


def test_a_resumed_run_holds_each_round_once(tmp_path: Path) -> None:
    def row(rnd: int, acc: float) -> dict[str, Any]:
        return {"round": rnd, "test-acc": acc, "train-loss": 1.0 / rnd, "round-seconds": 0.5,
                "elapsed-seconds": float(rnd), "clients-trained": [0, 1]}

    first = Recorder(tmp_path, {"seed": 0}, tracking="tensorboard")
    for rnd in (1, 2, 3):  # round 3 finished but was not checkpointed: the crash
        first.add_round(row(rnd, 0.1 * rnd))
    kept = first.rows[:2]
    resumed = Recorder(tmp_path, {"seed": 0}, keep_rounds=2, rows=kept, tracking="tensorboard")
    for rnd in (3, 4):
        resumed.add_round(row(rnd, 0.5 + 0.1 * rnd))
    events = read_events(tmp_path)
    for tag in events.Tags()["scalars"]:  # one event per round: the first run's 3 is gone
        assert [e.step for e in events.Scalars(tag)] == [1, 2, 3, 4], tag
    got = scalars(events)
    assert got["eval/test-acc"][3] == pytest.approx(0.8) and got["eval/test-acc"][2] == (
        pytest.approx(0.2))
    assert got == expected(resumed.rows)


def test_tracking_off_writes_no_event_files(tmp_path: Path) -> None:
    rec = Recorder(tmp_path, {}, tracking="off")
    rec.add_round({"round": 1, "test-acc": 0.5})
    assert not (tmp_path / EVENTS_DIR).exists()


def test_tracking_values_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"tracking='wandb' is not allowed.*tensorboard \| off"):
        RunConfig.parse({"tracking": "wandb"})


def test_tensorboard_missing_is_one_line_before_any_work(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)  # import fails as if uninstalled
    with pytest.raises(TrackingUnavailable, match="tracking=off") as err:
        check_available("tensorboard")
    assert "\n" not in str(err.value)
    check_available("off")  # nothing asked, nothing needed
