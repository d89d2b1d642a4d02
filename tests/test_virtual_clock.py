"""``device-speeds`` and the virtual clock: seeded slowdowns, simulated durations computed by
hand, sync rounds advancing by their slowest reply, over-selection keeping the m fastest in
simulated time, and FedBuff handling replies in simulated-finish order whatever order they
arrive in (flushes, staleness and sim-time against a schedule worked out by hand below)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
from flwr.app import Message

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import ConfigError, RunConfig
from fedinit.config.device_speeds import STEP_SECONDS, durations, slowdowns
from fedinit.methods import wire as rk
from fedinit.task.federated_data import client_examples
from server_app.async_rounds import run_async_experiment
from server_app.experiment import run_experiment
from strategies import async_loop
from strategies.virtual_clock import VirtualClock
from tests.test_async_rounds import fedbuff_by_hand, first_model

pytestmark = pytest.mark.usefixtures("quick_runs", "fake_clock")  # no plot read, no real wait


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shuffled grid hides replies on purpose: poll again at once, not after 0.1 s."""
    monkeypatch.setattr(async_loop, "POLL_SECONDS", 0.001)


BASE = {"train-limit": 150, "local-epochs": 1, "batch-size": 50, "personal-eval-every": 0,
        "tracking": "off", "partition": "iid", "eval-every": 100}


def speeds_file(tmp: Path, values: list[float]) -> str:
    path = tmp / "speeds.txt"
    path.write_text("# slowdown per partition id\n" + "\n".join(map(str, values)) + "\n")
    return f"file:{path}"


def rows_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / "rounds.jsonl").read_text().splitlines()]


def final_of(run_dir: Path) -> list[np.ndarray]:
    with np.load(run_dir / "final_model.npz") as z:
        return [z[f"arr_{i}"] for i in range(len(z.files))]


@pytest.mark.parametrize("spec", ["fast", "slow:0:5", "slow:0.2", "slow:1.5:5", "slow:0.2:0",
                                  "lognormal:0", "lognormal:nan", "lognormal:", "file:",
                                  "off:1"])
def test_a_bad_spec_is_one_line_naming_the_key(spec: str) -> None:
    with pytest.raises(ConfigError, match=r"^run config: device-speeds=.* allowed: off \| "
                                          r"slow:FRACTION:FACTOR") as err:
        RunConfig.parse({"device-speeds": spec})
    assert "\n" not in str(err.value)


def test_slow_marks_exactly_the_fraction_seeded_and_lognormal_has_median_one() -> None:
    s = slowdowns("slow:0.2:5", 100, seed=3)
    assert s is not None and sorted(set(s.tolist())) == [1.0, 5.0]
    assert int((s == 5.0).sum()) == 20
    again, other = slowdowns("slow:0.2:5", 100, 3), slowdowns("slow:0.2:5", 100, 4)
    assert np.array_equal(s, again) and not np.array_equal(s, other)
    ln = slowdowns("lognormal:0.5", 4000, seed=0)
    assert ln is not None and (ln > 0).all()
    assert abs(float(np.median(np.log(ln)))) < 0.05
    assert abs(float(np.std(np.log(ln))) - 0.5) < 0.03
    assert slowdowns("off", 10, 0) is None


def test_a_file_gives_each_client_its_line_and_a_wrong_count_is_refused(tmp_path: Path) -> None:
    spec = speeds_file(tmp_path, [1.0, 2.5, 0.5])
    got = slowdowns(spec, 3, seed=0)
    assert got is not None and got.tolist() == [1.0, 2.5, 0.5]
    with pytest.raises(ConfigError, match=r"holds 3 slowdowns; allowed: exactly "
                                          r"num-clients=4 numbers > 0"):
        slowdowns(spec, 4, seed=0)
    with pytest.raises(ConfigError, match="cannot be read"):
        slowdowns(f"file:{tmp_path / 'missing.txt'}", 3, seed=0)


def test_duration_is_slowdown_times_local_steps_times_the_unit() -> None:
    # 2 epochs; 50 examples at B=50 is 1 step, 120 is 3 (the last partial batch counts)
    got = durations([1.0, 2.0], [50, 120], local_epochs=2, batch_size=50)
    assert got.tolist() == pytest.approx([2 * 1 * STEP_SECONDS, 2 * 2 * 3 * STEP_SECONDS])


def test_task_time_task_is_the_slowdown_times_the_mean_steps() -> None:
    # steps 2 x 1 and 2 x 3: mean 4; a task of either client lasts s_i x 4 steps
    got = durations([1.0, 2.0], [50, 120], local_epochs=2, batch_size=50, task_time="task")
    assert got.tolist() == pytest.approx([4 * STEP_SECONDS, 2 * 4 * STEP_SECONDS])
    with pytest.raises(ValueError, match="task-time='step' is not allowed; allowed: steps"):
        durations([1.0], [50], local_epochs=1, batch_size=50, task_time="step")
    with pytest.raises(ConfigError, match=r"task-time='tasks' is not allowed.*steps \| task"):
        RunConfig.parse({"task-time": "tasks"})


def test_the_run_clock_takes_task_time_from_the_config(tmp_path: Path) -> None:
    slow = [1.0, 3.0, 2.0]
    raw = {**BASE, "num-clients": 3, "train-limit": 500, "partition": "dirichlet",
           "dirichlet-alpha": 0.5, "device-speeds": speeds_file(tmp_path, slow)}
    steps = VirtualClock.for_run(RunConfig.parse(raw))
    task = VirtualClock.for_run(RunConfig.parse({**raw, "task-time": "task"}))
    assert steps is not None and task is not None
    d = hand_durations(RunConfig.parse(raw), slow)
    assert steps.task_seconds.tolist() == pytest.approx(d)
    mean_steps = np.mean([x / s for x, s in zip(d, slow, strict=True)])
    assert task.task_seconds.tolist() == pytest.approx([s * mean_steps for s in slow])


def hand_durations(cfg: RunConfig, slow: list[float]) -> list[float]:
    """d_i from each client's own examples (``client_examples``, not partition_sizes)."""
    t = cfg.train
    return [s * t.local_epochs * math.ceil(len(client_examples(cfg, cid)[1]) / t.batch_size)
            * STEP_SECONDS for cid, s in enumerate(slow)]


def test_a_sync_round_advances_sim_time_by_its_slowest_reply(tmp_path: Path) -> None:
    slow = [1.0, 3.0, 2.0, 5.0, 1.5]
    raw = {**BASE, "num-clients": 5, "fraction-train": 0.4, "num-server-rounds": 4,
           "train-limit": 500, "partition": "dirichlet", "dirichlet-alpha": 0.5,
           "device-speeds": speeds_file(tmp_path, slow), "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    run_experiment(InProcessGrid(5, cfg.to_dict()), cfg, out_dir=tmp_path / "run")
    rows = rows_of(tmp_path / "run")
    d = hand_durations(cfg, slow)
    assert len(set(d)) > 2  # sizes and speeds differ: the max is a real choice
    want = np.cumsum([max(d[p] for p in r["clients-trained"]) for r in rows])
    assert [r["sim-time"] for r in rows] == pytest.approx(want.tolist())
    assert all(len(r["clients-trained"]) == 2 for r in rows)


class ReversedGrid(InProcessGrid):
    """A sync round's replies come back in reverse push order."""

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return list(reversed(list(super().send_and_receive(messages, timeout=timeout))))


def test_over_select_keeps_the_m_fastest_in_simulated_time(tmp_path: Path) -> None:
    slow = [4.0, 1.0, 3.0, 2.0, 6.0, 5.0]  # equal partitions: the order is the slowdowns'
    raw = {**BASE, "num-clients": 6, "fraction-train": 1 / 3, "over-select": 1.0,
           "num-server-rounds": 3, "train-limit": 180, "beta": 0.0,
           "device-speeds": speeds_file(tmp_path, slow), "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    finals = []
    for name, grid_type in (("plain", InProcessGrid), ("reversed", ReversedGrid)):
        grid = grid_type(6, cfg.to_dict())
        run_experiment(grid, cfg, out_dir=tmp_path / name)
        rows = rows_of(tmp_path / name)
        sampled = [sorted(m.metadata.dst_node_id - 1000 for m in grid.sent
                          if m.metadata.message_type == "train"
                          and int(m.content.config_records[rk.CONFIG][rk.ROUND]) == r)
                   for r in (1, 2, 3)]
        d = hand_durations(cfg, slow)
        for row, who in zip(rows, sampled, strict=True):
            assert len(who) == 4 and row["over-selected"] == 4
            fastest = sorted(who, key=lambda p: d[p])[:2]
            assert row["clients-trained"] == sorted(fastest), (who, row)
            assert row["dropped-late"] == 2 and row["accepted-at-close"] == 2
        want = np.cumsum([max(d[p] for p in r["clients-trained"]) for r in rows])
        assert [r["sim-time"] for r in rows] == pytest.approx(want.tolist())
        finals.append(final_of(tmp_path / name))
    assert all(np.array_equal(a, b) for a, b in zip(*finals, strict=True))


class ShuffledGrid(InProcessGrid):
    """Each pull hands back a seeded random half of the replies waiting (asked for or not:
    a leaky grid), in random order, so replies arrive late, early and out of order; every
    train reply handed back is kept in order."""

    def __init__(self, raw: dict[str, Any], seed: int) -> None:
        super().__init__(raw["num-clients"], raw)
        self.rng = np.random.default_rng(seed)
        self.pulled: list[Message] = []

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        waiting = sorted({*message_ids, *(r.metadata.reply_to_message_id
                                          for r in self._pending)})
        ids = [i for i in waiting if self.rng.random() < 0.5]
        out = list(super().pull_messages(ids))
        out = [out[i] for i in self.rng.permutation(len(out))]
        self.pulled.extend(m for m in out if m.metadata.message_type == "train")
        return out


ASYNC = {**BASE, "num-clients": 3, "rounds": "async", "concurrency": 3, "buffer-size": 2,
         "num-server-rounds": 3, "staleness": "poly", "staleness-a": 0.5}


def test_async_flushes_follow_the_simulated_schedule_worked_out_by_hand(
        tmp_path: Path) -> None:
    """3 clients of 50 examples, 1 step each, slowdowns 1, 2.4, 6.3 (units u = STEP_SECONDS);
    all three always busy, so a finished client is sent the newest model at once. Finishes:
    c0 at 1, 2, 3, 4, 5 ...; c1 at 2.4, 4.8; c2 at 6.3. With K=2:
    flush 1 at 2: c0 (sent at 0, v0), c0 (sent at 1, v0): tau 0, 0;
    flush 2 at 3: c1 (sent at 0, v0), c0 (sent at 2, v1): tau 1, 0;
    flush 3 at 4.8: c0 (sent at 3, v2), c1 (sent at 2.4, v1): tau 0, 1."""
    slow = [1.0, 2.4, 6.3]
    raw = {**ASYNC, "device-speeds": speeds_file(tmp_path, slow), "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    finals = []
    for name, seed in (("a", 0), ("b", 1)):
        grid = ShuffledGrid(cfg.to_dict(), seed)
        run_async_experiment(grid, cfg, tmp_path / name)
        rows = rows_of(tmp_path / name)
        u = STEP_SECONDS
        assert [r["sim-time"] for r in rows] == pytest.approx([2 * u, 3 * u, 4.8 * u])
        assert [r["clients-trained"] for r in rows] == [[0, 0], [0, 1], [0, 1]]
        assert [r["staleness-max"] for r in rows] == [0, 1, 1]
        assert [r["staleness-mean"] for r in rows] == [0.0, 0.5, 0.5]
        arrived = [m.metadata.src_node_id - 1000 for m in grid.pulled]
        assert arrived[:6] != [0, 0, 1, 0, 0, 1]  # the grid really mixed the order up
        # the hand schedule's order: each client's tasks finish in the order they were sent
        sent: dict[int, list[str]] = {}
        for m in grid.sent:
            if m.metadata.message_type == "train":
                sent.setdefault(m.metadata.dst_node_id - 1000, []).append(m.metadata.message_id)
        reply_to = {m.metadata.reply_to_message_id: m for m in grid.pulled}
        handled = [reply_to[sent[p].pop(0)] for p in (0, 0, 1, 0, 0, 1)]
        s = {t: (1.0 + t) ** -0.5 for t in range(5)}
        want, taus, _ = fedbuff_by_hand(cast(Any, SimpleNamespace(sent=grid.sent,
                                                                  pulled=handled)),
                                        first_model(grid), 2, 3, s)
        assert taus == [[0, 0], [0, 1], [0, 1]]
        got = final_of(tmp_path / name)
        assert max(float(np.abs(a - b).max()) for a, b in zip(got, want, strict=True)) < 1e-6
        finals.append(got)
    assert all(np.array_equal(a, b) for a, b in zip(*finals, strict=True))


def test_without_the_clock_async_depends_on_arrival_order(tmp_path: Path) -> None:
    """The same two arrival orders with ``device-speeds=off`` give different models: the
    bit-identity above is the clock's doing, not the grid's."""
    raw = {**ASYNC, "output-dir": str(tmp_path)}
    cfg = RunConfig.parse(raw)
    finals = []
    for name, seed in (("a", 0), ("b", 1)):
        run_async_experiment(ShuffledGrid(cfg.to_dict(), seed), cfg, tmp_path / name)
        assert "sim-time" not in rows_of(tmp_path / name)[0]
        finals.append(final_of(tmp_path / name))
    assert not all(np.array_equal(a, b) for a, b in zip(*finals, strict=True))
