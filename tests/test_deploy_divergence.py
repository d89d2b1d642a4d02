"""The paper's all-client divergence term in a real deployment, against the nodes' own files.

Three SuperNodes (process deployment, no TLS) run 2 rounds of SCAFFOLD + RI with one client
trained a round and ``divergence-every=1``: every node is asked for ||w_prev_i - w^t||^2 after
each round, also the ones that never trained (they count with w_0). The last round's
``divergence-all`` must equal the mean computed in numpy from what the run left on disk: the
global model in ``checkpoint.npz`` and each node's newest state file in its ``state-dir``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from fedinit.config import RunConfig
from fedinit.store.files import read_record
from fedinit.task.models import initial_weights
from server_app.checkpoint import load_checkpoint
from tests.deploy_helpers import deploy_three_insecure, rounds, run_dir

BASE_PORT = int(os.environ.get("FEDINIT_TEST_DIVERGENCE_PORT", "42550"))  # +0, +1, +10..+12
EXPERIMENT = ["num-server-rounds=2", "fraction-train=0.34", "train-limit=900", "seed=2",
              "method='scaffold'", "beta=0.1", "local-epochs=1", "divergence-every=1",
              "personal-eval-every=0"]


def squared_distance(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return sum(float(np.sum((x.astype(np.float64) - y.astype(np.float64)) ** 2))
               for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_deployed_all_client_divergence_equals_the_nodes_stored_states(tmp_path: Path) -> None:
    work, out = tmp_path / "deploy", tmp_path / "out"
    deploy_three_insecure(work, out, BASE_PORT, EXPERIMENT)
    run = run_dir(out)
    cfg = RunConfig.parse({k: v for k, v in json.loads((run / "config.json").read_text()).items()
                           if k not in ("output-dir", "resume-dir")})
    w_t = load_checkpoint(run).weights
    distances, untrained = [], 0
    for node in range(3):  # node i holds client i (deploy_local's partition-id)
        files = sorted((work / f"node-{node}" / "client-state").glob(
            f"{run.name}/client-{node}/r*.npz"))
        if files:
            w_prev = read_record(files[-1])[0]["w_prev"]
        else:
            w_prev, untrained = initial_weights(cfg), untrained + 1
        distances.append(squared_distance(w_prev, w_t))
    last = rounds(run)[-1]
    assert last["divergence-clients"] == 3
    assert last["divergence-untrained"] == untrained
    assert untrained >= 1, "with one client a round for 2 rounds, a node never trained"
    assert last["divergence-all"] == pytest.approx(float(np.mean(distances)), rel=1e-9)
