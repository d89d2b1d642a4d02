"""``MethodStrategy`` is a drop-in Flower ``Strategy``: driven by Flower's own
``Strategy.start`` it trains the model the project's round loop (``run_experiment``) trains,
bit for bit, because it takes everything it needs at construction (``for_run``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.task.models import initial_weights
from server_app.experiment import run_experiment
from strategies.method_strategy import MethodStrategy

pytestmark = pytest.mark.usefixtures("quick_runs")

SMALL = {"num-clients": 4, "fraction-train": 0.5, "num-server-rounds": 3, "train-limit": 800,
         "local-epochs": 1, "personal-eval-every": 0, "eval-every": 3, "beta": 0.1}


@pytest.mark.parametrize("method", ["scaffold", "fedadam"])
def test_flowers_strategy_start_trains_what_run_experiment_trains(tmp_path: Path,
                                                                  method: str) -> None:
    cfg = RunConfig.parse({**SMALL, "method": method, "output-dir": str(tmp_path)})
    run_experiment(InProcessGrid(cfg.num_clients, cfg.to_dict()), cfg, out_dir=tmp_path / "run")
    with np.load(tmp_path / "run" / "final_model.npz") as z:
        want = [z[f"arr_{i}"] for i in range(len(z.files))]

    w0 = initial_weights(cfg)
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
    strategy = MethodStrategy.for_run(cfg, {cid: 1000 + cid for cid in range(4)}, w0)
    result = strategy.start(grid, ArrayRecord(w0), num_rounds=cfg.train.num_server_rounds,
                            timeout=cfg.fleet.round_timeout,
                            train_config=ConfigRecord({rk.EXPERIMENT: "run"}))
    got = unpack(result.arrays)
    assert all(a.tobytes() == b.tobytes() for a, b in zip(want, got, strict=True))
    # the strategy's checks ran: every round aggregated the sampled clients' replies
    assert [m[rk.NUM_REPLIES] for m in result.train_metrics_clientapp.values()] == [2, 2, 2]
