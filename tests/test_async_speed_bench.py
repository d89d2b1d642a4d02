"""bench/async_speed.py's bookkeeping: the points it writes read back as the rows it printed
from, and ``last-5`` is the mean of the last five evaluations (rows without one skipped)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.async_speed import csv_rows, expand, last_mean, plot, table, write_csv


def test_the_csv_reads_back_as_the_evaluated_rows(tmp_path: Path) -> None:
    rows = [{"round": r, "sim-time": 1.5 * r, "test-acc": None if r % 2 else r / 10}
            for r in range(1, 9)]
    results = {"slow:0.2:5/task|fedinit": {"0": {"sync": rows, "async": rows[:4]}}}
    write_csv(results, tmp_path / "p.csv")
    back = csv_rows(tmp_path / "p.csv")
    want = [r for r in rows if r["test-acc"] is not None]
    assert back == {"slow:0.2:5/task|fedinit": {"0": {"sync": want, "async": want[:2]}}}
    assert table(back, 0.5) == table(results, 0.5)
    (tmp_path / "bad.csv").write_text("speeds,method\n")
    with pytest.raises(SystemExit, match="header 'speeds,method' is not device-speeds"):
        csv_rows(tmp_path / "bad.csv")


def test_last_five_is_the_mean_of_the_last_five_evaluations() -> None:
    accs = [0.1, None, 0.2, 0.3, None, 0.4, 0.5, 0.9]
    rows = [{"round": i, "test-acc": a} for i, a in enumerate(accs)]
    assert last_mean(rows) == pytest.approx((0.2 + 0.3 + 0.4 + 0.5 + 0.9) / 5)
    assert last_mean(rows[:3], count=5) == pytest.approx(0.15)


def test_the_plot_draws_every_mode_the_bench_runs(tmp_path: Path) -> None:
    # async-balanced and async-half have dash tuples: passed as a format string they made
    # matplotlib read them as data ("could not be cast to an at-least-1D array").
    rows = [{"round": r, "sim-time": 1.0 * r, "test-acc": r / 10} for r in range(1, 5)]
    modes = ("sync", "over-select", "async", "async-balanced", "async-half", "async-constant")
    results = {"slow:0.2:5|fedinit": {"0": {m: rows for m in modes}}}
    plot(results, tmp_path / "p.png", 0.7, "test")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_dc_and_concurrency_modes_expand_to_one_run_each() -> None:
    modes = expand(["async", "async-half", "async-dc", "async-conc"], 10, [0.25, 1.0], [7, 8])
    assert list(modes) == ["async", "async-half", "async-dc0.25", "async-dc1", "async-c7",
                           "async-c8"]
    assert modes["async-half"] == {"rounds": "async", "concurrency": 5, "buffer-size": 10}
    assert modes["async-dc1"] == {"rounds": "async", "stale-correction": "dc", "dc-lambda": 1.0}
    assert modes["async-c7"] == {"rounds": "async", "concurrency": 7, "buffer-size": 10}
    assert modes["async"] == {"rounds": "async"}
