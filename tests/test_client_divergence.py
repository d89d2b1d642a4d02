"""The paper's all-client divergence term, (1/C) sum_i ||w_prev_i - w^t||^2, against an
independent computation from the clients' stored state files and the server's checkpoint.

Flower's simulation engine runs in this process (tests/sim_engine.py): the evaluate messages,
the clients' state files and the checkpoint are the real ones. After every round the test
reads the global model from checkpoint.npz and each client's newest state file (w_0 for a
client that has not trained), and recomputes the mean in numpy.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Message, MessageType

from fedinit.config import ConfigError, RunConfig
from fedinit.store.files import read_record
from fedinit.store.simulated_state import RUN_SUBDIR
from fedinit.task.models import initial_weights
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from tests.sim_engine import InProcessSimulation

pytestmark = pytest.mark.usefixtures("quick_runs")

TINY = {"num-clients": 6, "fraction-train": 0.34, "num-server-rounds": 3, "train-limit": 600,
        "local-epochs": 1, "beta": 0.1, "method": "scaffold", "eval-every": 3,
        "personal-eval-every": 0, "divergence-every": 1}


def by_hand(run_dir: Path, cfg: RunConfig) -> tuple[float, int, float]:
    """(mean over all clients of ||w_prev_i - w||^2, clients still at w_0, the mean over the
    clients that trained) from the files."""
    w = load_checkpoint(run_dir).weights
    w0 = initial_weights(cfg)
    exp = run_dir / RUN_SUBDIR / run_dir.name
    total, trained, untrained = [], [], 0
    for cid in range(cfg.num_clients):
        files = sorted((exp / f"client-{cid}").glob("r*.npz"))
        if files:
            w_prev = read_record(files[-1])[0]["w_prev"]
        else:
            w_prev, untrained = w0, untrained + 1
        total.append(sum(float(np.sum((p.astype(np.float64) - g.astype(np.float64)) ** 2))
                         for p, g in zip(w_prev, w, strict=True)))
        if files:
            trained.append(total[-1])
    return float(np.mean(total)), untrained, float(np.mean(trained))


def run(tmp: Path, **over: Any) -> tuple[list[dict[str, Any]], list[tuple[float, int, float]]]:
    overrides = {**TINY, **over, "output-dir": str(tmp / "out")}
    cfg = RunConfig.parse(overrides)
    run_dir = tmp / "run"
    expected: list[tuple[float, int, float]] = []
    with InProcessSimulation(cfg.num_clients, overrides) as sim:
        send = sim.grid.send_and_receive

        def checking(messages: Iterable[Message], *, timeout: float | None = None
                     ) -> Iterable[Message]:
            msgs = list(messages)
            if msgs and msgs[0].metadata.message_type == MessageType.TRAIN and \
                    (run_dir / "checkpoint.npz").exists():
                expected.append(by_hand(run_dir, cfg))
            return send(msgs, timeout=timeout)

        sim.grid.send_and_receive = checking  # type: ignore[method-assign]
        summary = run_experiment(sim.grid, cfg, out_dir=run_dir)
    expected.append(by_hand(run_dir, cfg))
    assert summary["final-test-acc"] is not None
    rows = load_checkpoint(run_dir).rows or []
    return rows, expected


def test_all_client_divergence_equals_the_mean_over_the_stored_states(tmp_path: Path) -> None:
    rows, expected = run(tmp_path)
    assert len(rows) == len(expected) == 3
    for row, (mean, untrained, trained) in zip(rows, expected, strict=True):
        assert row["divergence-clients"] == 6
        assert row["divergence-untrained"] == untrained
        assert row["divergence-all"] == pytest.approx(mean, rel=1e-9)
        assert row["divergence-trained"] == pytest.approx(trained, rel=1e-9)
        assert row.get("divergence-sample") is None
    assert expected[0][1] == 4  # 2 of 6 trained in round 1: four counted at w_0
    # it is not the sampled-client term the row's `divergence` has always held
    assert all(abs(r["divergence-all"] - r["divergence"]) > 1e-6 for r in rows)


def test_a_seeded_sample_is_named_as_one(tmp_path: Path) -> None:
    rows, _ = run(tmp_path, **{"divergence-clients": 3, "divergence-every": 2,
                               "num-server-rounds": 2})
    assert [r.get("divergence-sample") is not None for r in rows] == [False, True]
    assert rows[1]["divergence-clients"] == 3 and rows[1].get("divergence-all") is None


def test_negative_settings_are_refused() -> None:
    with pytest.raises(ConfigError, match="divergence-every=-1"):
        RunConfig.parse({"divergence-every": -1})
