"""Availability windows in a ``device-speeds`` file: who a sync round can sample, which tasks
are lost when a window closes mid-task, and how far the virtual clock moves, each against a
schedule worked out by hand below; a bad line refused in one line; a file whose windows cover
all time giving the run without windows bit for bit; under ``rounds=async`` a task lost when
its window closes (its slot re-sent then), the jump to the next window start, and a resume
with such a task in flight."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import ConfigError, RunConfig
from fedinit.config.device_speeds import read_speeds_file
from fedinit.methods import wire as rk
from server_app.async_rounds import run_async_experiment
from server_app.experiment import run_experiment
from tests.test_virtual_clock import final_of, rows_of

pytestmark = pytest.mark.usefixtures("quick_runs", "fake_clock")

BASE = {"train-limit": 200, "local-epochs": 1, "batch-size": 50, "personal-eval-every": 0,
        "tracking": "off", "partition": "iid", "eval-every": 100, "num-clients": 4}
"""4 clients of 50 examples: one local step each, so d_i = s_i x 0.05 simulated s."""


def windows_file(tmp: Path, lines: list[str]) -> str:
    path = tmp / "speeds.txt"
    path.write_text("# slowdown, then availability windows START-END\n" + "\n".join(lines)
                    + "\n")
    return f"file:{path}"


def sampled_by_round(grid: InProcessGrid, rounds: int) -> list[list[int]]:
    return [sorted(m.metadata.dst_node_id - 1000 for m in grid.sent
                   if m.metadata.message_type == "train"
                   and int(m.content.config_records[rk.CONFIG][rk.ROUND]) == r)
            for r in range(1, rounds + 1)]


SCHEDULE = ["1 0-0.33",             # c0: d 0.05
            "2 0-0.08 0.7-inf",     # c1: d 0.10
            "1 0.2-0.6",            # c2: d 0.05
            "3 0.32-0.38 0.9-1.1"]  # c3: d 0.15
"""m = 2 clients per round. Worked out by hand (t: the round's start; a window [a, b) holds
t if a <= t < b; a task started at t is lost if t + d > b; the round lasts until its last
reply or its last lost device left, whichever is later):
round 1, t 0: available {0, 1}; c1 lost (0.10 > 0.08, left at 0.08): ends 0.08;
round 2, t 0.08: only c0; c2's window opens at 0.2 -> wait: {0, 2}, ends 0.25;
round 3, t 0.25: {0, 2}, ends 0.30;
round 4, t 0.30: {0, 2} (c3 opens at 0.32); c0 lost (0.35 > 0.33, left at 0.33): ends 0.35;
round 5, t 0.35: {2, 3}; c3 lost (0.50 > 0.38, left at 0.38): ends 0.40;
round 6, t 0.40: only c2; at 0.7 only c1 (c2 closed at 0.6); at 0.9 {1, 3}: ends 1.05;
round 7, t 1.05: {1, 3}; c3 lost (1.20 > 1.1, left at 1.1): c1 ends 1.15;
round 8, t 1.15: only c1, and no window opens later: the round runs with it, ends 1.25."""
SAMPLED = [[0, 1], [0, 2], [0, 2], [0, 2], [2, 3], [1, 3], [1, 3], [1]]
TRAINED = [[0], [0, 2], [0, 2], [2], [2], [1, 3], [1], [1]]
SIM_TIME = [0.08, 0.25, 0.30, 0.35, 0.40, 1.05, 1.15, 1.25]


def test_sync_rounds_sample_the_available_lose_the_late_and_wait_for_windows(
        tmp_path: Path) -> None:
    raw = {**BASE, "fraction-train": 0.5, "num-server-rounds": 8,
           "device-speeds": windows_file(tmp_path, SCHEDULE), "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    grid = InProcessGrid(4, cfg.to_dict())
    run_experiment(grid, cfg, out_dir=tmp_path / "run")
    rows = rows_of(tmp_path / "run")
    assert sampled_by_round(grid, 8) == TRAINED  # a lost task is never sent
    assert [r["clients-trained"] for r in rows] == TRAINED
    assert [r["num-replies"] for r in rows] == [len(t) for t in TRAINED]
    assert [r["num-missing"] for r in rows] == [len(s) - len(t)
                                               for s, t in zip(SAMPLED, TRAINED, strict=True)]
    assert [r["sim-time"] for r in rows] == pytest.approx(SIM_TIME)


def test_over_select_closes_on_the_fastest_reply_that_is_not_lost(tmp_path: Path) -> None:
    """m = 1, over-select 1: 2 sampled. At t 0 only c0 and c1 are available; c0 is the
    fastest (0.05) but its window closes at 0.03, so the round closes on c1 (0.20)."""
    lines = ["1 0-0.03", "4", "2 0.5-inf", "1 0.5-inf"]
    raw = {**BASE, "fraction-train": 0.25, "over-select": 1.0, "num-server-rounds": 1,
           "device-speeds": windows_file(tmp_path, lines), "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    grid = InProcessGrid(4, cfg.to_dict())
    run_experiment(grid, cfg, out_dir=tmp_path / "run")
    (row,) = rows_of(tmp_path / "run")
    assert sampled_by_round(grid, 1) == [[1]]  # c0's lost task is never sent
    assert row["over-selected"] == 2 and row["num-missing"] == 1
    assert row["clients-trained"] == [1] and row["accepted-at-close"] == 1
    assert row["sim-time"] == pytest.approx(0.20)


def test_windows_that_always_hold_give_the_run_without_windows_bit_for_bit(
        tmp_path: Path) -> None:
    slow = ["1", "2.5", "0.7", "4"]
    finals, rows = [], []
    for name, lines in (("plain", slow), ("always", [f"{s} 0-inf" for s in slow])):
        (tmp_path / name).mkdir()
        raw = {**BASE, "fraction-train": 0.5, "num-server-rounds": 3, "partition": "dirichlet",
               "dirichlet-alpha": 0.5, "device-speeds": windows_file(tmp_path / name, lines),
               "output-dir": str(tmp_path)}
        cfg = RunConfig.parse(raw)
        run_experiment(InProcessGrid(4, cfg.to_dict()), cfg, out_dir=tmp_path / name / "run")
        finals.append(final_of(tmp_path / name / "run"))
        rows.append([(r["clients-trained"], r["sim-time"]) for r in rows_of(
            tmp_path / name / "run")])
    assert rows[0] == rows[1]
    assert all(np.array_equal(a, b) for a, b in zip(*finals, strict=True))


@pytest.mark.parametrize(("line", "why"), [
    ("x 0-1", "does not start with a slowdown"),
    ("0 0-1", "does not start with a slowdown > 0"),
    ("1 5", "'5', not a window START-END"),
    ("1 2-1", "'2-1', not a window START-END"),
    ("1 -1-2", "'-1-2', not a window START-END"),
    ("1 0-nan", "'0-nan', not a window START-END"),
    ("1 0-5 3-9", "out of order, overlapping or touching"),
    ("1 0-5 5-9", "out of order, overlapping or touching"),
])
def test_a_bad_line_is_refused_in_one_line_naming_file_line_and_rule(
        tmp_path: Path, line: str, why: str) -> None:
    spec = windows_file(tmp_path, ["1", line])  # the comment is line 1, this line 3
    with pytest.raises(ConfigError) as err:
        read_speeds_file(spec[len("file:"):], 2)
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith(f"run config: device-speeds={spec!r} line 3: {line!r}")
    assert why in msg and msg.endswith("START < END (END may be inf), increasing, not touching")


def test_a_file_of_slowdowns_only_has_no_windows(tmp_path: Path) -> None:
    slow, windows = read_speeds_file(windows_file(tmp_path, ["1", "2.5"])[5:], 2)
    assert slow.tolist() == [1.0, 2.5] and windows is None
    _, windows = read_speeds_file(windows_file(tmp_path, ["1", "2 0-1.5 3-inf"])[5:], 2)
    assert windows == (None, ((0.0, 1.5), (3.0, float("inf"))))


ASYNC = {**BASE, "num-clients": 3, "train-limit": 150, "rounds": "async", "staleness": "poly",
         "staleness-a": 0.5}


def test_async_loses_a_task_whose_window_closes_and_resends_its_slot(tmp_path: Path) -> None:
    """Concurrency 2, K = 2; d: c0 0.05 (always), c1 0.10 (0-0.08, 0.3-), c2 0.05 (0.06-).
    By hand: at 0 the idle clients in a window are c0, c1: both sent v0; c1's ends at 0.10,
    after its window closes at 0.08: lost there. 0.05: c0 replies (v0), re-sent v0, ends
    0.10. 0.08: c1 lost; its slot goes to c2 (in its window since 0.06), v0, ends 0.13.
    0.10: c0 replies: flush 1 = [c0 tau 0, c0 tau 0]; c0 sent v1, ends 0.15. 0.13: c2
    replies (v0), re-sent v1 (c1 is out of its window), ends 0.18. 0.15: c0 replies (v1):
    flush 2 = [c2 tau 1, c0 tau 0]."""
    lines = ["1", "2 0-0.08 0.3-inf", "1 0.06-inf"]
    raw = {**ASYNC, "concurrency": 2, "buffer-size": 2, "num-server-rounds": 2,
           "device-speeds": windows_file(tmp_path, lines), "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    grid = InProcessGrid(3, cfg.to_dict())
    run_async_experiment(grid, cfg, tmp_path / "run")
    rows = rows_of(tmp_path / "run")
    assert [r["sim-time"] for r in rows] == pytest.approx([0.10, 0.15])
    assert [r["num-missing"] for r in rows] == [1, 0]
    s1 = 2 ** -0.5
    assert [r["buffered"] for r in rows] == [[[0, 0, 0, 1.0], [0, 0, 0, 1.0]],
                                             [[2, 0, 1, pytest.approx(s1)], [0, 1, 0, 1.0]]]
    pushed = [m.metadata.dst_node_id - 1000 for m in grid.sent
              if m.metadata.message_type == "train"]
    assert pushed == [0, 0, 2, 0, 2]  # c1's lost task was never sent; the order of 0.00 is 0
    assert rows[-1]["dispatched"] == 6


def test_async_jumps_to_the_next_window_when_no_idle_client_is_in_one(tmp_path: Path) -> None:
    """Concurrency 1, K = 1; d 0.05 each; c0 in 0-0.07, c1 in 0.5-, c2 never before 9.
    By hand: c0 sent at 0, flush 1 at 0.05; c0 sent again at 0.05 would end at 0.10, after
    0.07: lost at 0.07; no idle client is in a window then: the clock jumps to 0.5, c1 sent,
    flush 2 at 0.55."""
    lines = ["1 0-0.07", "1 0.5-inf", "1 9-inf"]
    raw = {**ASYNC, "concurrency": 1, "buffer-size": 1, "num-server-rounds": 2,
           "device-speeds": windows_file(tmp_path, lines), "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    run_async_experiment(InProcessGrid(3, cfg.to_dict()), cfg, tmp_path / "run")
    rows = rows_of(tmp_path / "run")
    assert [r["sim-time"] for r in rows] == pytest.approx([0.05, 0.55])
    assert [r["clients-trained"] for r in rows] == [[0], [1]]
    assert [r["num-missing"] for r in rows] == [0, 1]


def test_a_resume_loses_a_lost_task_in_flight_again_at_its_window_end(tmp_path: Path) -> None:
    """d: c0 0.05 (always), c1 0.20 in 0-0.15 (its task of 0 is lost at 0.15), c2 0.05 from
    0.06. Flush 1 at 0.10 with c1's lost task in flight; the server dies at the next push.
    The resumed run must know that task for a lost one by its finish (0.15, its window's
    end) and lose it again, never send it: rows and model equal the uninterrupted run's."""
    from tests.test_async_resume import SIMULATED, KilledGrid, final_model, same

    lines = ["1", "4 0-0.15", "1 0.06-inf"]
    raw = {**ASYNC, "concurrency": 2, "buffer-size": 2, "num-server-rounds": 4,
           "device-speeds": windows_file(tmp_path, lines), "output-dir": str(tmp_path),
           "client-state-dir": str(tmp_path / "state")}
    cfg = RunConfig.parse(raw)
    run_async_experiment(InProcessGrid(3, cfg.to_dict()), cfg, tmp_path / "ref")
    with pytest.raises(KeyboardInterrupt):
        run_async_experiment(KilledGrid(3, cfg), cfg, tmp_path / "crash")
    assert [r["round"] for r in rows_of(tmp_path / "crash")] == [1]
    resumed = RunConfig.parse({**raw, "resume-dir": str(tmp_path / "crash")})
    grid = InProcessGrid(3, resumed.to_dict())
    run_async_experiment(grid, resumed)
    assert not any(m.metadata.dst_node_id == 1001 for m in grid.sent
                   if m.metadata.message_type == "train")
    got, want = rows_of(tmp_path / "crash"), rows_of(tmp_path / "ref")
    assert [r["num-missing"] for r in want] == [0, 1, 0, 0]
    assert [{k: r.get(k) for k in SIMULATED} for r in got] == \
        [{k: r.get(k) for k in SIMULATED} for r in want]
    assert same(final_model(tmp_path / "crash"), final_model(tmp_path / "ref"))
