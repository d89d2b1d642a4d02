"""Secure aggregation in a real deployment (slow): TLS + SuperNode authentication, 4 SuperNodes,
one of them on Flower's own executor (a new ClientApp process per message, so the protocol
client's secrets must travel in ``context.state`` between its five messages of a round).

The same FedInit config runs twice, with ``secure-aggregation`` off and ``secagg+``: both
complete with every client in every round, the secure run's nodes answered the key-exchange
and unmask queries, and its final model is the plain run's within the quantisation allowance
(each round's mean is off by less than one step 2c/2^bits per coordinate; 10 steps for two
rounds, as tests/test_secagg_run.py allows in process). Every node signs its SecAgg+ keys with
its node key and verifies its neighbours' against the peer list deploy_local hands it
(``secagg-signing-key``, ``secagg-peer-keys``): the server logs 4 of 4 signed each round, and
no node leaves a neighbour out; so every round runs the consistency check (4 of 4 survivors
sign the survivor set) and every node then releases its shares.
Ports: FEDINIT_TEST_SECAGG_PORT (default 42650): +0, +1, +10..+13.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fedinit.cli.deploy_local import Deployment
from fedinit.config import RunConfig
from testbeds.deployment_runs import FlwrRun, completed_run, deployed, final_model
from tests.deploy_helpers import rounds

BASE_PORT = int(os.environ.get("FEDINIT_TEST_SECAGG_PORT", "42650"))
NODES = 4
CFG = {"method": "fedavg", "beta": 0.1,  # FedInit: FedAvg with RI
       "num-clients": NODES, "fraction-train": 1.0,
       "num-server-rounds": 2, "eval-every": 2, "personal-eval-every": 0, "train-limit": 400,
       "local-epochs": 1, "seed": 0, "weighting": "uniform", "max-update-norm-ratio": 0.0,
       "node-wait-timeout": 90.0, "round-timeout": 120.0, "tracking": "off"}


class MixedExecutors(Deployment):
    """Node 1 runs Flower's ``flower-superexec`` (a process per message), the others the warm
    executor."""

    def node_command(self, i: int, *args: object, **kwargs: object) -> list[str]:
        cmd = super().node_command(i, *args, **kwargs)  # type: ignore[arg-type]
        if i == 1:
            cmd[cmd.index("--executor") + 1] = "flower"
        return cmd


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with deployed(MixedExecutors(tmp_path / "deploy", NODES, base_port=BASE_PORT),
                  tmp_path) as dep:
        yield dep


def queries_answered(dep: Deployment, run_id: str) -> list[int]:
    """Query messages each node received in run ``run_id`` (identity + SecAgg+ stages)."""
    pattern = re.compile(rf"\[RUN {run_id}(?:, ROUND [^\]]*)?\]\s*\n[^\n]*?:\s+Receiving: "
                         r"query message")
    return [len(pattern.findall((dep.logs / f"supernode-{i}.log").read_text(errors="replace")))
            for i in range(NODES)]


@pytest.mark.slow
def test_secure_aggregation_over_tls_with_four_nodes_matches_the_plain_run(
        deployment: Deployment, tmp_path: Path) -> None:
    dep = deployment
    cfg = {**CFG, "node-registry": str(dep.registry)}
    plain = completed_run(dep, "plain", cfg, tmp_path / "plain")
    secure_cfg = {**cfg, "secure-aggregation": "secagg+", "output-dir": str(tmp_path / "sec")}
    run = FlwrRun(dep, "secure", secure_cfg)
    try:
        run_id = run.run_id()
        status = run.wait(400)
    finally:
        run.stop()
    assert status == "finished:completed", run.text()[-3000:]
    signed = "secure aggregation: 4 of 4 clients signed their keys"
    assert [f"round {r}: {signed}" in run.text() for r in (1, 2)] == [True, True], \
        run.text()[-3000:]
    checked = "secure aggregation: consistency check: 4 of 4 survivors signed the survivor set"
    assert [f"round {r}: {checked}" in run.text() for r in (1, 2)] == [True, True], \
        run.text()[-3000:]
    assert dep.peer_keys.read_text().count("ecdsa-sha2-nistp384") == NODES
    node_logs = [(dep.logs / f"supernode-{i}.log").read_text(errors="replace")
                 for i in range(NODES)]
    assert not [t for t in node_logs if "whose keys it cannot verify" in t
                or "refused the secure-aggregation query" in t]
    (secure,) = [d for d in (tmp_path / "sec").iterdir() if d.is_dir()]
    every = list(range(NODES))
    assert [r["clients-trained"] for r in rounds(secure)] == [every, every]
    assert [r["clients-trained"] for r in rounds(plain)] == [every, every]
    # identity (once) + setup, share keys, check and unmask (4 a round, 2 rounds) on each node
    assert queries_answered(dep, run_id) == [9] * NODES, queries_answered(dep, run_id)
    parsed = RunConfig.parse({**CFG, "secure-aggregation": "secagg+"})
    step = 2 * parsed.privacy.secagg_clip / 2**parsed.privacy.secagg_bits
    gap = max(float(np.max(np.abs(a.astype(np.float64) - b)))
              for a, b in zip(final_model(secure), final_model(plain), strict=True))
    print(f"\nsecagg+ over TLS, {NODES} nodes (node 1 on Flower's executor): final model within "
          f"{gap:.2e} of the plain run's (step {step:.2e}); rows "
          f"{[(r['round'], round(r['round-seconds'], 1)) for r in rounds(secure)]} against "
          f"{[(r['round'], round(r['round-seconds'], 1)) for r in rounds(plain)]}")
    assert 0 < gap < 10 * step
