"""``fedinit-report paired``: two modes on the same seeds, checked against a computation by
hand (the t quantile for 3 degrees of freedom is 3.182446, from a printed table)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from fedinit.cli import report
from fedinit.cli.paired import PairError, pair, where

ROWS = [  # mode, seed, acc; seed 9 only under sync, a fedavg row to filter out
    ("sync", "0", 0.70), ("async", "0", 0.68), ("sync", "1", 0.72), ("async", "1", 0.73),
    ("sync", "2", 0.65), ("async", "2", 0.61), ("sync", "10", 0.69), ("async", "10", 0.66),
    ("sync", "9", 0.99)]


def table(path: Path, extra: bool = True) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["mode", "seed", "method", "test-acc"])
        for mode, seed, acc in ROWS:
            w.writerow([mode, seed, "fedinit", acc])
        if extra:
            w.writerow(["async", "0", "fedavg", 0.10])
    return path


def test_the_mean_difference_and_its_interval_match_a_hand_computation(tmp_path: Path) -> None:
    with table(tmp_path / "r.csv").open(newline="") as f:
        p = pair(where(csv.DictReader(f), ["method=fedinit"]), "mode", "sync", "async",
                 "test-acc")
    d = [-0.02, 0.01, -0.04, -0.03]  # async - sync for seeds 0, 1, 2, 10
    assert p.keys == ("0", "1", "2", "10") and p.unpaired == ("9",)
    assert p.diffs == pytest.approx(d)
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    half = 3.182446 * sd / 2
    assert p.mean == pytest.approx(-0.02)
    assert p.interval() == pytest.approx((mean - half, mean + half), abs=1e-6)


def test_the_command_prints_every_seed_and_the_interval(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = table(tmp_path / "r.csv")
    assert report.main(["paired", str(path), "--by", "mode", "--a", "sync", "--b", "async",
                        "--metric", "test-acc", "--where", "method=fedinit"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "test-acc: async - sync, paired by seed"
    assert [line.split() for line in out[1:5]] == [["0", "-0.0200"], ["1", "+0.0100"],
                                                    ["2", "-0.0400"], ["10", "-0.0300"]]
    assert out[5] == "  left out (only one mode has them): 9"
    # sd of the differences sqrt(0.0014 / 3) = 0.021602; half-width 3.182446 x 0.021602 / 2
    assert out[6] == "mean -0.0200, 95% interval [-0.0544, +0.0144] over 4 seeds"


def test_two_rows_of_one_mode_and_seed_are_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = table(tmp_path / "r.csv")
    assert report.main(["paired", str(path), "--by", "mode", "--a", "sync", "--b", "async",
                        "--metric", "test-acc"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("fedinit-report paired: mode='async' has two rows for seed=('0',); "
                   "allowed: one per seed (narrow it with --where)")


@pytest.mark.parametrize(("args", "line"), [
    (["--metric", "acc"], "column 'acc' is not in the rows; allowed: method, mode, seed, "
                          "test-acc"),
    (["--metric", "test-acc", "--where", "method"], "--where 'method' is not allowed; "
                                                    "allowed: COLUMN=VALUE")])
def test_a_bad_column_or_condition_is_refused(tmp_path: Path, args: list[str], line: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = table(tmp_path / "r.csv", extra=False)
    assert report.main(["paired", str(path), "--by", "mode", "--a", "sync", "--b", "async",
                        *args]) == 2
    assert capsys.readouterr().err.strip() == f"fedinit-report paired: {line}"


def test_one_seed_gives_no_interval() -> None:
    p = pair([{"mode": "a", "seed": "0", "m": "1"}, {"mode": "b", "seed": "0", "m": "2"}],
             "mode", "a", "b", "m")
    with pytest.raises(PairError, match="1 paired seed"):
        p.interval()
