"""Process deployments with client-level DP: epsilon reported, the sample kept secret.

Same machinery as tests/test_deploy_process.py (fedinit/cli/deploy_local.py, real SuperLink and
SuperNodes). First: 2 rounds, 2 of 3 clients per round, central DP: the accounting is the
server's, so the deployment's rounds.jsonl must carry the accountant's epsilon of each round.
Second (issue 42, item 2): half the registered devices offline, two deployments equal but for
the secret sampling seed; their public files must not tell the samples apart.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedinit.cli.deploy_local import Deployment, pids_mentioning, stop_pids
from fedinit.methods.dp_budget import Budget
from server_app.checkpoint import load_checkpoint
from server_app.status import STATUS_FILE
from strategies.operator_log import OPERATOR_LOG
from strategies.round_stages.sampling import SEED_ENV
from testbeds.deployment_runs import FlwrRun
from tests.deploy_helpers import deploy_three_insecure, rounds, run_dir
from tests.public_files import (
    differences,
    online_counts,
    public_view,
    seeds_with_different_samples,
)

BASE_PORT = 41100  # this test's own ports: 41100-41101 and 41110-41112
SAMPLE_PORTS = (41150, 41170)
"""The two half-offline deployments (4 registered nodes): base, base + 1, base + 10..13."""
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
    private = load_checkpoint(run).rows  # the counts are the operator's under DP
    assert all(r["num-replies"] == 2 and r["num-rejected"] == 0 for r in private)
    assert all("num-replies" not in r for r in rows)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["dp-epsilon"] == pytest.approx(budget.epsilon(2))
    assert summary["config"]["dp"] == "central"


N, M, ROUNDS, ONLINE = 4, 2, 3, (0, 1)
HALF_OFFLINE = {"num-clients": N, "fraction-train": M / N, "num-server-rounds": ROUNDS,
                "min-clients": len(ONLINE), "train-limit": 400, "local-epochs": 1, "seed": 0,
                "dp": "central", "weighting": "uniform", "dp-clip": 0.5,
                "dp-noise-multiplier": 1.0, "personal-eval-every": 0, "round-timeout": 60.0,
                "node-wait-timeout": 120.0, "tracking": "tensorboard"}


def half_offline_run(work: Path, base: int, seed: int,
                     monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A TLS deployment of N registered nodes with only ``ONLINE`` started, the ServerApp's
    secret sampling seed fixed to ``seed`` (the SuperLink's environment, which the ServerApp
    process inherits); its run directory and the `flwr run` log."""
    monkeypatch.setenv(SEED_ENV, str(seed))
    dep = Deployment(work / "deploy", N, base_port=base)
    try:
        dep.up(start=list(ONLINE))
        run = FlwrRun(dep, "run", {**HALF_OFFLINE, "node-registry": str(dep.registry),
                                   "output-dir": str(work / "out")})
        try:
            status = run.wait(400)
        finally:
            run.stop()
        text = run.text()
        assert status == "finished:completed", text[-3000:]
    finally:
        dep.stop()
        stop_pids(pids_mentioning(str(work)))
    return run_dir(work / "out"), text


@pytest.mark.slow
def test_half_the_fleet_offline_two_secret_samples_one_public_view(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """4 registered devices, 2 offline, m = 2, dp=central: run a samples both online clients
    in round 1, run b neither (the checkpoint, the operator's, shows it). rows, summary,
    status.json (so the fleet page and /metrics), config, the ledger and TensorBoard differ
    only in the released model's accuracy and loss, the clock and the operator's paths
    (tests/public_files.py), and the log's round lines only in accuracy and loss."""
    seeds = seeds_with_different_samples(N, M, ONLINE, ROUNDS,
                                         lambda a, b: a[0] == 2 and b[0] == 0)
    (a, log_a), (b, log_b) = (
        half_offline_run(tmp_path / name, base, seed, monkeypatch)
        for name, base, seed in zip("ab", SAMPLE_PORTS, seeds, strict=True))
    replies = [online_counts(load_checkpoint(d).rows) for d in (a, b)]
    print(f"\nsecret seeds {seeds}: replies per round {replies} (operator-secret)")
    assert replies[0][0] == 2 and replies[1][0] == 0, replies
    view_a, view_b = public_view(a), public_view(b)
    assert differences(view_a, view_b) == []
    assert view_a["tensorboard wall times"] == 1
    nodes = json.loads((a / STATUS_FILE).read_text())["fleet"]["nodes"]
    assert sorted(n["state"] for n in nodes) == ["identified"] * 2 + ["registered"] * 2
    assert not any("connected" in n for n in nodes)

    def round_lines(text: str) -> list[str]:
        lines = re.findall(r"\[round \d+/\d+\][^\n]*", text)
        return [re.sub(r"acc +(-|\S+%) +loss +\S+", "acc _ loss _", x) for x in lines]

    assert round_lines(log_a) == round_lines(log_b)  # the stream may repeat a line
    assert len(set(round_lines(log_a))) == ROUNDS
    assert "replies 2/2" in (a / OPERATOR_LOG).read_text()  # the operator's own file
