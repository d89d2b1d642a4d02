"""A short process deployment on a regimes data set computes what an in-process run does.

Each SuperNode derives its client's regime and transformed data from the run config and its
partition id (fedinit/task/federated_data.py); 3 nodes in 3 label-permutation regimes, so every node
sees its own labelling, in training and in its local test split (personalized evaluation).
Were a node to derive another regime or partition, its replies and local accuracies would
differ from the in-process run (fedinit/cli/inprocess_run.py: the same ServerApp and ClientApp
code, no Flower processes). Same tolerances as tests/test_deploy_process.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from server_app.results import read_personal_clients
from tests.deploy_helpers import deploy_three_insecure, diffs, rounds, run_dir
from tests.test_deploy_process import TOLERANCE

BASE_PORT = int(os.environ.get("FEDINIT_TEST_REGIMES_PORT", "42500"))  # +0, +1, +10..+12
EXPERIMENT = ["num-server-rounds=2", "fraction-train=1.0", "train-limit=900", "seed=1",
              "num-regimes=3", "regime-kind='permute-labels'", "personal-eval-every=2",
              "personal-eval-clients=0"]


@pytest.mark.slow
def test_deployed_clients_derive_their_regimes_as_in_process(tmp_path: Path) -> None:
    work, dep_out, ref_out = tmp_path / "deploy", tmp_path / "dep-out", tmp_path / "ref-out"
    deploy_three_insecure(work, dep_out, BASE_PORT, EXPERIMENT)
    ref = subprocess.run(
        [sys.executable, "-m", "fedinit.cli.inprocess_run", "num-clients=3", *EXPERIMENT,
         f"output-dir={ref_out}"], capture_output=True, text=True, timeout=300, check=False)
    assert ref.returncode == 0, ref.stdout[-3000:] + ref.stderr[-3000:]

    dep_run, ref_run = run_dir(dep_out), run_dir(ref_out)
    regimes = (dep_run / "regimes.csv").read_text()
    assert regimes == (ref_run / "regimes.csv").read_text()
    assert sorted(line.split(",")[1] for line in regimes.splitlines()[1:]) == ["0", "1", "2"]
    diff = diffs(rounds(dep_run), rounds(ref_run))
    assert all(diff[k] <= TOLERANCE[k] for k in diff), diff
    dep_clients, ref_clients = read_personal_clients(dep_run), read_personal_clients(ref_run)
    assert [c["partition-id"] for c in dep_clients] == ["0", "1", "2"]
    for d, r in zip(dep_clients, ref_clients, strict=True):
        assert d["num-test"] == r["num-test"]
        for kind in ("global", "finetuned", "own"):  # at most one test example apart
            assert abs(float(d[f"acc-{kind}"]) - float(r[f"acc-{kind}"])) <= (
                1.0 / int(d["num-test"]) + 1e-12), (kind, d, r)
    summary = json.loads((dep_run / "summary.json").read_text())
    assert summary["central-test"].startswith("regime 0")
    assert summary["config"]["num-regimes"] == 3
