"""``over-select``: a sync round samples ceil(m(1+o)) clients and aggregates exactly the first
m replies the decode checks accept, in arrival order; every later reply is dropped, in this
round and in any later one. The arrival order is the test's (``OrderedGrid``), and each round's
model is checked against FedAvg recomputed here from the replies it should have used."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import ConfigError, RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from server_app.experiment import run_experiment
from tests.test_resume_and_faults import corrupt

pytestmark = pytest.mark.usefixtures("quick_runs", "fake_clock")  # no plot read, no real wait

SMALL = {"num-clients": 6, "fraction-train": 0.5, "train-limit": 180, "local-epochs": 1,
         "batch-size": 50, "personal-eval-every": 0, "tracking": "off", "beta": 0.0,
         "ri-aggregation": "model", "num-server-rounds": 3, "eval-every": 3}


class OrderedGrid(InProcessGrid):
    """Train replies arrive one per pull, in an order set per round (odd rounds: highest
    partition first; even: lowest first). Leaky on purpose: each pull also hands back every
    train reply a previous round left unpulled, whatever ids it was asked for, so a loop that
    trusted the grid would aggregate a late reply in a later round."""

    def __init__(self, raw: dict[str, Any]) -> None:
        super().__init__(raw["num-clients"], raw)
        self.round_of_id: dict[str, int] = {}
        self.pushes = 0
        self.pulled: list[Message] = []

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        msgs = list(messages)
        self.pushes += any(m.metadata.message_type == "train" for m in msgs)
        ids = list(super().push_messages(msgs))
        for i in ids:
            self.round_of_id[i] = self.pushes
        odd = self.pushes % 2 == 1
        self._pending.sort(key=lambda r: (self.round_of_id[r.metadata.reply_to_message_id],
                                          -r.metadata.src_node_id if odd
                                          else r.metadata.src_node_id))
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        wanted = set(message_ids)
        stale = [r for r in self._pending if r.metadata.message_type == "train"
                 and self.round_of_id[r.metadata.reply_to_message_id] < self.pushes]
        fresh = [r for r in self._pending if r.metadata.reply_to_message_id in wanted][:1]
        out = stale + fresh
        self._pending = [r for r in self._pending if r not in out]
        self.pulled.extend(out)
        return out


def run(tmp: Path, grid: InProcessGrid | None = None, **over: Any) -> tuple[
        InProcessGrid, list[np.ndarray], list[dict[str, Any]]]:
    raw = {**SMALL, "output-dir": str(tmp), **over}
    cfg = RunConfig.parse(raw)
    grid = grid or InProcessGrid(cfg.num_clients, cfg.to_dict())
    run_experiment(grid, cfg, out_dir=tmp)
    with np.load(tmp / "final_model.npz") as z:
        final = [z[f"arr_{i}"] for i in range(len(z.files))]
    rows = [json.loads(x) for x in (tmp / "rounds.jsonl").read_text().splitlines()]
    return grid, final, rows


def train_sent(grid: InProcessGrid) -> list[Message]:
    return [m for m in grid.sent if m.metadata.message_type == "train"]


def fedavg(replies: list[Message]) -> list[np.ndarray]:
    """sum n_i w_i / sum n_i over ``replies`` (ri-aggregation=model, eta_g = 1)."""
    models = [unpack(r.content.array_records[rk.ARRAYS]) for r in replies]
    n = [int(r.content.metric_records[rk.METRICS][rk.NUM_EXAMPLES]) for r in replies]
    return [sum(k * w[i].astype(np.float64) for k, w in zip(n, models, strict=True)) / sum(n)
            for i in range(len(models[0]))]


def finite(reply: Message) -> bool:
    return not reply.has_error() and all(
        np.all(np.isfinite(a)) for a in unpack(reply.content.array_records[rk.ARRAYS]))


@pytest.mark.parametrize("nan", [False, True])
def test_each_round_closes_at_m_accepted_and_never_aggregates_a_late_reply(
        tmp_path: Path, nan: bool) -> None:
    raw = {**SMALL, "over-select": 1.0, "output-dir": str(tmp_path)}
    grid = OrderedGrid(RunConfig.parse(raw).to_dict())
    if nan:  # node 1005's replies are NaN: first in odd rounds, rejected, not one of the m
        grid.reply_filter = corrupt("nan", 1005)
    _, final, rows = run(tmp_path, grid, **{"over-select": 1.0})
    m, sent = 3, train_sent(grid)
    by_round: dict[int, list[Message]] = {}
    for msg in sent:  # round r's train messages: the r-th push of train messages
        by_round.setdefault(grid.round_of_id[msg.metadata.message_id], []).append(msg)
    assert sorted(by_round) == [1, 2, 3] and all(len(v) == 6 for v in by_round.values())
    models = [*(unpack(by_round[r][0].content.array_records[rk.ARRAYS]) for r in (2, 3)),
              final]
    for rnd, row in enumerate(rows, start=1):
        ids = {x.metadata.message_id for x in by_round[rnd]}
        arrived = [r for r in grid.pulled if r.metadata.reply_to_message_id in ids]
        first = [r for r in arrived if finite(r)][:m]
        assert len(first) == m
        want = sorted(r.metadata.src_node_id for r in first)
        expect = [1005, 1004, 1003] if rnd % 2 else [1000, 1001, 1002]
        nan_first = nan and rnd % 2 == 1
        if nan_first:
            expect = [1004, 1003, 1002]
        assert want == sorted(expect)
        got = models[rnd - 1]
        ref = fedavg(first)
        assert max(float(np.max(np.abs(g - r))) for g, r in zip(got, ref, strict=True)) < 1e-5
        for other in (r for r in arrived if r not in first and finite(r)):  # a late one moves it
            moved = fedavg([*first, other])
            assert max(float(np.max(np.abs(g - r)))
                       for g, r in zip(got, moved, strict=True)) > 1e-4
        rejected = 1 if nan_first else 0
        assert row["num-replies"] == m and row["num-rejected"] == rejected
        assert row["over-selected"] == 6 and row["accepted-at-close"] == m
        assert row["dropped-late"] == 6 - m - rejected
        assert row["clients-trained"] == sorted(
            x - 1000 for x in [*expect, *([1005] if nan_first else [])])


def test_over_select_zero_is_todays_round(tmp_path: Path) -> None:
    """o = 0: the round is Grid.send_and_receive as before (nothing pushed by the over-select
    loop), the same model bit for bit, and rows without the over-select columns."""
    grid_a, a, rows_a = run(tmp_path / "a", OrderedGrid(RunConfig.parse(SMALL).to_dict()))
    grid_b, b, rows_b = run(tmp_path / "b", OrderedGrid(RunConfig.parse(SMALL).to_dict()),
                            **{"over-select": 0.0})
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert isinstance(grid_b, OrderedGrid) and grid_b.pushes == 0
    assert all(len(train_sent(g)) == 9 for g in (grid_a, grid_b))
    assert "dropped-late" not in rows_b[0]
    assert [r["num-replies"] for r in rows_b] == [3, 3, 3]


def test_over_selected_round_samples_ceil_m_times_one_plus_o(tmp_path: Path) -> None:
    cfg = RunConfig.parse({**SMALL, "over-select": 0.34})
    assert cfg.clients_per_round == 3 and cfg.sampled_per_round == math.ceil(3 * 1.34) == 5
    assert RunConfig.parse({**SMALL, "over-select": 1.0}).sampled_per_round == 6


@pytest.mark.parametrize(("over", "line"), [
    ({"over-select": -0.5}, "run config: over-select=-0.5 is not allowed; allowed: a finite "
                            "number >= 0 (0 turns over-selection off)"),
    ({"over-select": float("nan")}, "over-select=nan"),
    ({"over-select": 1.5}, "run config: over-select=1.5 is not allowed; allowed: at most 1 "
                           "(ceil(m (1 + o)) = 8 clients > num-clients=6)"),
    ({"over-select": 0.5, "dp": "central", "weighting": "uniform", "ri-aggregation": "update"},
     "run config: dp='central' is not allowed; allowed: off with over-select=0.5 (the "
     "accountant's amplification by sampling"),
    ({"over-select": 0.5, "rounds": "async", "num-server-rounds": 1, "eval-every": 1},
     "run config: rounds='async' is not allowed; allowed: sync with over-select=0.5"),
    ({"over-select": 0.5, "secure-aggregation": "secagg+", "weighting": "uniform",
      "max-update-norm-ratio": 0.0},
     "run config: secure-aggregation='secagg+' is not allowed; allowed: off with "
     "over-select=0.5"),
])
def test_config_errors_are_one_line(over: dict[str, Any], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**SMALL, **over})
    assert str(err.value).startswith(line) or (line.startswith("over-select=nan")
                                               and line in str(err.value))
    assert "\n" not in str(err.value)
