"""``fedinit-report paired --stat ratio``: per-seed B / A (A's own column with
``--metric-a``), its mean and t interval against a hand computation, as issue 45 reports the
updates async needs to reach sync's final accuracy (t_{0.975, 2} = 4.302653, a printed
table's value)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from fedinit.cli import report
from fedinit.cli.paired import PairError, pair

HEAD = ["mode", "seed", "sync-updates", "updates-to-sync-final", "t-to-target"]
ROWS = [["sync", "0", 400, 380, 40.0], ["async", "0", 400, 600, 16.0],
        ["sync", "1", 400, 400, 50.0], ["async", "1", 400, 480, 20.0],
        ["sync", "2", 400, 360, 45.0], ["async", "2", 400, 720, 15.0]]


def table(path: Path) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEAD)
        w.writerows(ROWS)
    return path


def test_the_ratio_of_updates_and_of_times_match_a_hand_computation(tmp_path: Path) -> None:
    with table(tmp_path / "r.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    p = pair(rows, "mode", "sync", "async", "updates-to-sync-final", stat="ratio",
             metric_a="sync-updates")
    r = [600 / 400, 480 / 400, 720 / 400]  # 1.5, 1.2, 1.8: async's updates over sync's 400
    assert p.diffs == pytest.approx(r)
    sd = math.sqrt(sum((x - 1.5) ** 2 for x in r) / 2)  # 0.3
    assert p.mean == pytest.approx(1.5)
    assert p.interval() == pytest.approx((1.5 - 4.302653 * sd / math.sqrt(3),
                                          1.5 + 4.302653 * sd / math.sqrt(3)), abs=1e-6)
    speed = pair(rows, "mode", "async", "sync", "t-to-target", stat="ratio")
    assert speed.diffs == pytest.approx([40 / 16, 50 / 20, 45 / 15])  # 2.5, 2.5, 3.0
    diff = pair(rows, "mode", "sync", "async", "updates-to-sync-final")
    assert diff.diffs == pytest.approx([220, 80, 360])  # the default is still B - A
    rows[2]["t-to-target"] = "nan"  # sync of seed 1 never reached the target
    left = pair(rows, "mode", "async", "sync", "t-to-target", stat="ratio", drop_nan=True)
    assert left.keys == ("0", "2") and left.unpaired == ("1",)
    assert left.diffs == pytest.approx([2.5, 3.0])


def test_the_command_and_its_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = table(tmp_path / "r.csv")
    args = ["paired", str(path), "--by", "mode", "--a", "sync", "--b", "async",
            "--metric", "updates-to-sync-final", "--metric-a", "sync-updates"]
    assert report.main([*args, "--stat", "ratio"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "updates-to-sync-final: async / sync (sync-updates), paired by seed"
    assert out[-1] == "mean +1.5000, 95% interval [+0.7548, +2.2452] over 3 seeds"
    assert report.main([*args, "--stat", "mean"]) == 2
    assert capsys.readouterr().err.strip() == ("fedinit-report paired: --stat 'mean' is not "
                                               "allowed; allowed: diff | ratio")
    rows = [{"mode": "sync", "seed": "0", "x": "0"}, {"mode": "async", "seed": "0", "x": "2"}]
    with pytest.raises(PairError, match="mode='sync' has x=0 for seed=0; allowed: a non-zero"):
        pair(rows, "mode", "sync", "async", "x", stat="ratio")
