"""bench/async_speed.py's paired bookkeeping (issue 45): the accepted updates a mode needs to
reach sync's final accuracy of the same seed, worked by hand on made-up rows; the stop
condition of ``--until-sync``; ``--custom`` modes; and the pairing fingerprint (the same for
every mode of a seed, another for another seed)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench.async_speed import (
    PAIRED_HEAD,
    custom_modes,
    paired_rows,
    pairing,
    reach,
    sync_stop,
    write_paired,
)


def rows(accs: list[float | None], t0: float = 1.0) -> list[dict[str, object]]:
    return [{"round": i + 1, "sim-time": t0 * (i + 1), "test-acc": a}
            for i, a in enumerate(accs)]


SYNC = rows([None, 0.5, None, 0.6, None, 0.62, None, 0.64, None, 0.7, None, 0.66], 4.0)
"""12 rounds of m = 10: final 0.66, last-5 mean (0.6 + 0.62 + 0.64 + 0.7 + 0.66) / 5 = 0.644,
0.7 first reached at round 10 (sim 40)."""
FAST = rows([None, 0.55, None, 0.6, None, 0.65, None, 0.71, None, 0.6, None, 0.68, None, 0.67,
             None, 0.66, None, 0.7])
"""An async run of K = 10 per flush: its first evaluation >= 0.66 at flush 8 (0.71, sim 8),
its last-5 mean >= 0.644 first at flush 12 ((0.6 + 0.65 + 0.71 + 0.6 + 0.68) / 5 = 0.648; at
flush 10 it is (0.55 + 0.6 + 0.65 + 0.71 + 0.6) / 5 = 0.622)."""


def test_reach_and_the_paired_row_by_hand() -> None:
    assert reach(FAST, 0.66) == 8
    assert reach(FAST, 0.644, 5) == 12
    assert reach(FAST, 0.9) is None
    out = paired_rows("slow:0.2:5|fedinit", "3", {"sync": SYNC, "async": FAST}, 0.7,
                      {"sync": 10, "async": 10}, 10, {"sync": "h", "async": "h"})
    row = dict(zip(PAIRED_HEAD, out[1], strict=True))
    assert row["sync-updates"] == 120 and row["sync-final"] == "0.6600"
    assert row["sync-last5"] == "0.6440"
    assert row["updates-to-sync-final"] == 80 and row["ratio-to-sync-final"] == "0.6667"
    assert row["updates-to-sync-last5"] == 120 and row["reached"] == 1
    # 0.7 first at flush 8 (sim 8) against sync's round 10 (sim 40): 5x sooner
    assert row["t-to-target"] == "8.0000" and row["speed-up"] == "5.0000"
    # after sync's 120 updates (flush 12): its last evaluation 0.68
    assert row["acc-at-sync-updates"] == "0.6800" and row["flushes-run"] == 18
    short = paired_rows("s|m", "3", {"sync": SYNC, "async": FAST[:6]}, 0.7,
                        {"sync": 10, "async": 10}, 10, {"sync": "h", "async": "h"})[1]
    cut = dict(zip(PAIRED_HEAD, short, strict=True))
    assert cut["reached"] == 0 and cut["updates-to-sync-final"] == 60  # a lower bound


def test_the_stop_condition_and_the_csv(tmp_path: Path) -> None:
    stop = sync_stop(SYNC, 0.7)
    # final and 0.7 at flush 8, the last-5 mean at 12; without the last-5: 8
    assert [n for n in range(1, 19) if stop(FAST[:n])][0] == 12
    early = sync_stop(SYNC, 0.7, last5=False)
    assert [n for n in range(1, 19) if early(FAST[:n])][0] == 8
    assert not any(sync_stop(SYNC, 0.9)(FAST[:n]) for n in range(1, 19))
    path = tmp_path / "p.csv"
    write_paired([["a"] * len(PAIRED_HEAD)], path)
    write_paired([["b"] * len(PAIRED_HEAD)], path)
    with path.open(newline="") as f:
        got = list(csv.reader(f))
    assert got[0] == list(PAIRED_HEAD) and [r[0] for r in got[1:]] == ["a", "b"]


def test_custom_modes() -> None:
    assert custom_modes(["async-m0.5=rounds:async,server-momentum:0.5",
                         "adam=rounds:async,method:fedadam"]) == {
        "async-m0.5": {"rounds": "async", "server-momentum": 0.5},
        "adam": {"rounds": "async", "method": "fedadam"}}
    with pytest.raises(SystemExit, match="--custom 'x' is not allowed"):
        custom_modes(["x"])


@pytest.mark.usefixtures("quick_runs")
def test_the_pairing_is_the_seeds_not_the_modes() -> None:
    base = {"num-clients": 10, "train-limit": 300, "device-speeds": "slow:0.2:5",
            "personal-eval-every": 0, "seed": 4, "beta": 0.1}
    same = pairing(base)
    assert pairing({**base, "rounds": "async", "server-momentum": 0.5,
                    "async-lr-scale": 1.0}) == same
    assert pairing({**base, "method": "fedadam"}) == same
    assert pairing({**base, "seed": 5}) != same
