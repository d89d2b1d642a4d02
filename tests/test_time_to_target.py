"""Time to a target accuracy (the paper's Table 8): the first reaching round, 'not reached'."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from fedinit.cli.report import collect, markdown, write_report
from fedinit.cli.sweep_plan import PlanError, load_plan
from fedinit.cli.time_to_target import TargetHit, first_reaching, summarize
from tests.test_sweep import write


def rows(accs: list[float | None], secs_per_round: float = 2.0) -> list[dict[str, Any]]:
    """Rounds 1.. with these test accuracies (None: not evaluated) and elapsed seconds."""
    return [{"round": i + 1, "test-acc": a, "elapsed-seconds": secs_per_round * (i + 1)}
            for i, a in enumerate(accs)]


def test_raw_curve_gives_the_first_round_at_or_above_the_target() -> None:
    r = rows([0.50, 0.74, 0.75, 0.90, 0.60])
    assert first_reaching(r, 75.0, window=1) == TargetHit(3, 6.0)  # 75.00 counts (>=)
    assert first_reaching(r, 74.5, window=1) == TargetHit(3, 6.0)
    assert first_reaching(r, 74.0, window=1) == TargetHit(2, 4.0)
    assert first_reaching(r, 85.0, window=1) == TargetHit(4, 8.0)


def test_smoothing_waits_for_the_moving_average_not_one_lucky_round() -> None:
    # 3-point averages at rounds 3..7: .50, .60, .60, .80, .90 (round 2's .90 alone is not)
    r = rows([0.30, 0.90, 0.30, 0.60, 0.90, 0.90, 0.90])
    assert first_reaching(r, 70.0, window=3) == TargetHit(6, 12.0)
    assert first_reaching(r, 85.0, window=3) == TargetHit(7, 14.0)
    assert first_reaching(r, 85.0, window=1) == TargetHit(2, 4.0)


def test_rounds_without_evaluation_are_skipped_and_the_evaluated_round_is_reported() -> None:
    # evaluated every 2 rounds: .4 (r2), .8 (r4), .9 (r6); 2-point averages .6 (r4), .85 (r6)
    r = rows([None, 0.4, None, 0.8, None, 0.9], secs_per_round=3.0)
    assert first_reaching(r, 80.0, window=2) == TargetHit(6, 18.0)
    r[5]["elapsed-seconds"] = None
    assert first_reaching(r, 80.0, window=2) == TargetHit(6, None)


def test_not_reached_is_none_and_reported_as_not_reached() -> None:
    r = rows([0.5, 0.6, 0.7])
    assert first_reaching(r, 70.1, window=1) is None
    assert first_reaching(r, 70.0, window=5) is None  # the 3-point mean is .6
    assert first_reaching([], 10.0, window=5) is None
    assert summarize([None, None]) == "not reached (0/2)"
    assert summarize([TargetHit(10, 20.0), None]) == "10.0 r / 20 s (1/2 reached)"
    assert summarize([TargetHit(10, 20.0), TargetHit(13, 30.0)]) == "11.5 r / 25 s"
    with pytest.raises(ValueError, match="window=0"):
        first_reaching(r, 50.0, window=0)


def fake_cell(cell_dir: Path, config: dict[str, Any], accs: list[float]) -> None:
    run = cell_dir / "run-1"
    run.mkdir(parents=True)
    (run / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows(accs)))
    (run / "summary.json").write_text(json.dumps(
        {"config": config, "rounds": len(accs), "final-test-acc": accs[-1],
         "smoothed-peak-acc": max(accs), "mean-round-seconds": 2.0}))


def test_grid_target_gives_a_table_and_csv_columns(tmp_path: Path) -> None:
    grid = load_plan(write(tmp_path, """
        base: {num-server-rounds: 4}
        grid: {beta: [0.0, 0.1], seed: [0, 1]}
        metric: {window: 2, last: 2, target: 70.0}
    """))
    assert grid.target == 70.0 and grid.metric == {"window": 2, "last": 2}
    curves = {(0.0, 0): [0.5, 0.6, 0.7, 0.7], (0.0, 1): [0.5, 0.6, 0.6, 0.6],
              (0.1, 0): [0.6, 0.8, 0.8, 0.8], (0.1, 1): [0.7, 0.7, 0.7, 0.7]}
    for c in grid.cells:
        fake_cell(tmp_path / "cells" / c.id, c.config,
                  curves[(c.config["beta"], c.config["seed"])])
    results = collect(grid, tmp_path / "cells")
    md = markdown(grid, results, "cmd")
    table = md[md.index("Rounds / wall seconds to reach 70%"):].split("\n\n")[1].splitlines()
    # FedAvg: seed 0 reaches at round 4 (.70), seed 1 never; FedInit: rounds 2 and 2
    assert table[2] == "| FedAvg | 4.0 r / 8 s (1/2 reached) |"
    assert table[3] == "| FedInit | 2.0 r / 4 s |"
    write_report(grid, results, tmp_path / "out", "cmd", plots=False)
    with (tmp_path / "out" / "results.csv").open() as f:
        by_key = {(float(r["beta"]), int(r["seed"])): r for r in csv.DictReader(f)}
    assert by_key[(0.0, 1)]["target-round"] == "not reached"
    assert by_key[(0.0, 0)]["target-round"] == "4"
    assert by_key[(0.1, 1)]["target-seconds"] == "4.0"


def test_grid_without_target_keeps_the_csv_columns(tmp_path: Path) -> None:
    grid = load_plan(write(tmp_path, "grid: {seed: [0]}\n"))
    assert grid.target is None
    write_report(grid, collect(grid, tmp_path / "cells"), tmp_path / "out", "cmd", plots=False)
    header = (tmp_path / "out" / "results.csv").read_text().splitlines()[0]
    assert "target" not in header and header.endswith(",run-dir")


@pytest.mark.parametrize(("text", "expected"), [
    ("grid: {seed: [0]}\nmetric: {target: 150.0}\n", ":2: metric.target: expected an accuracy"),
    ("grid: {seed: [0]}\nmetric: {target: 0.5}\n", ":2: metric.target: expected a float >= 1"),
    ("grid: {seed: [0]}\nmetric: {target: high}\n", ":2: metric.target: expected a float"),
])
def test_bad_target_is_an_error_with_its_line(tmp_path: Path, text: str, expected: str) -> None:
    with pytest.raises(PlanError, match=expected):
        load_plan(write(tmp_path, text))
