"""The benchmark's plain loop and the Flower path drive the same method core.

``bench/plain_loop.py`` (no Flower: the compute floor) and ``run_experiment`` over the
in-process grid (the real strategy shell and ClientApp) must end on the same global model bit
for bit: both call the method's ``ServerRule.update`` and ``ClientRule``, so a method change
cannot make the benchmark measure something else than what runs.
"""

from pathlib import Path

import numpy as np
import pytest

from bench.plain_loop import plain_run
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods.registry import METHODS, composes_with_ri
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("quick_runs")

SMALL = {"num-clients": 4, "fraction-train": 0.5, "num-server-rounds": 2, "train-limit": 400,
         "local-epochs": 1, "batch-size": 32, "beta": 0.1}


@pytest.mark.parametrize("method", list(METHODS))
def test_plain_loop_ends_on_the_flower_path_model(method: str, tmp_path: Path) -> None:
    raw = {**SMALL, "method": method, "output-dir": str(tmp_path),
           **({} if composes_with_ri(method) else {"beta": 0.0})}
    cfg = RunConfig.parse(raw)
    _, plain = plain_run(cfg)
    run_experiment(InProcessGrid(cfg.num_clients, raw), cfg, out_dir=tmp_path / "run")
    flower = load_checkpoint(tmp_path / "run").weights
    for a, b in zip(plain, flower, strict=True):
        np.testing.assert_array_equal(a, b)
