"""FedRelax in a process deployment (3 SuperNodes over gRPC, deploy_local.py) (slow).

Each node receives its own neighbourhood term; the ServerApp keeps the clients' models in
the run directory (server-models/) and learns the graph. The deployment's rounds equal the
same config run through the real handlers in-process (tests/deploy_process's tolerance)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from server_app.experiment import run_experiment
from tests.deploy_helpers import DEPLOY_LOCAL, diffs, rounds, run_dir
from tests.test_deploy_process import TOLERANCE, leftovers

BASE_PORT = 42400  # this test's ports: 42400-42401 and 42410-42412
EXPERIMENT = {"method": "fedrelax", "beta": 0.0, "graph-k": 1, "graph-refresh-every": 2,
              "num-server-rounds": 3, "fraction-train": 1.0, "train-limit": 1500, "seed": 0,
              "personal-eval-every": 3, "personal-eval-clients": 0}


@pytest.mark.slow
def test_fedrelax_deployment_completes_and_equals_the_in_process_run(tmp_path: Path) -> None:
    work, dep_out = tmp_path / "deploy", tmp_path / "dep-out"
    dep = subprocess.run(
        [*DEPLOY_LOCAL, "--num-nodes", "3", "--work-dir", str(work), "--base-port",
         str(BASE_PORT), "--run-timeout", "600",
         *(f"{k}={v}" for k, v in EXPERIMENT.items()), f"output-dir={dep_out}"],
        capture_output=True, text=True, timeout=900, check=False)
    assert dep.returncode == 0, dep.stdout[-4000:] + dep.stderr[-3000:]
    assert "status finished:completed" in dep.stdout
    assert leftovers(work, BASE_PORT) == [], "deploy_local.py left processes running"
    run = run_dir(dep_out)
    assert sorted(p.parent.name for p in (run / "server-models").glob("*/r*.npz")) == [
        "0", "0", "1", "1", "2", "2"]  # the current and the previous version of each
    graph = json.loads((run / "graph.json").read_text())
    assert graph["round"] == 2 and graph["edges"]

    raw = {**EXPERIMENT, "num-clients": 3, "output-dir": str(tmp_path / "ref")}
    run_experiment(InProcessGrid(3, raw), RunConfig.parse(raw), out_dir=tmp_path / "ref-run")
    dep_rows, ref_rows = rounds(run), rounds(tmp_path / "ref-run")
    diff = diffs(dep_rows, ref_rows)
    assert all(diff[k] <= TOLERANCE[k] for k in diff), (diff, dep_rows, ref_rows)
    assert all(r["num-replies"] == 3 for r in dep_rows)
    for key in ("local-own-mean", "local-global-mean"):
        assert abs(dep_rows[-1][key] - ref_rows[-1][key]) <= 5e-3, key
    assert graph == json.loads((tmp_path / "ref-run" / "graph.json").read_text())
