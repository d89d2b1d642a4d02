"""A short process deployment with client-level DP on completes and reports epsilon.

Same machinery as tests/test_deploy_process.py (cli/deploy_local.py, real SuperLink and
SuperNodes), 2 rounds, 2 of 3 clients per round, central DP: the accounting is the server's,
so the deployment's rounds.jsonl must carry the accountant's epsilon of each round.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from methods.dp_budget import Budget
from tests.deploy_helpers import deploy_three_insecure, rounds, run_dir

BASE_PORT = 41100  # this test's own ports: 41100-41101 and 41110-41112
EXPERIMENT = ["num-server-rounds=2", "fraction-train=0.67", "train-limit=600", "seed=0",
              "dp='central'", "weighting='uniform'", "dp-clip=0.5", "dp-noise-multiplier=1.0"]


@pytest.mark.slow
def test_deployment_with_central_dp_reports_epsilon(tmp_path: Path) -> None:
    work, out = tmp_path / "deploy", tmp_path / "out"
    deploy_three_insecure(work, out, BASE_PORT, EXPERIMENT)
    run = run_dir(out)
    rows = rounds(run)
    budget = Budget("central", 1.0, 1, 3, 2, 1e-5)
    assert [r["round"] for r in rows] == [1, 2]
    assert [r["dp-epsilon"] for r in rows] == pytest.approx([budget.epsilon(1),
                                                             budget.epsilon(2)])
    assert all(r["num-replies"] == 2 and r["num-rejected"] == 0 for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dp-epsilon"] == pytest.approx(budget.epsilon(2))
    assert summary["config"]["dp"] == "central"
