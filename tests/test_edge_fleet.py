"""An edge fleet, all at once (slow): one TLS + node-auth process deployment, 5 devices that
bring their own image folders (Fashion-MNIST, skewed class mixes, made here), `min-clients=3`.
Two devices start late, one is killed mid-run, a sixth registered device with another
federation size joins, and one device's train task hangs once. The run completes, the late
devices train, no round after the first waits past round-timeout, the curve is federated.

It combines test_deploy_faults.py's changing federation, test_deploy_device_data.py's device
folders and test_warm_executor.py's hung task (a copy of the app, testbeds/fault_app.py) in one
deployment, so CI pays for one start-up.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from fedinit.cli.deploy_local import pids_mentioning, stop_pids
from fedinit.task.data_paths import default_data_dir
from fedinit.task.datasets import load_dataset
from testbeds.deployment_runs import FlwrRun, kill_process, wait_rounds
from testbeds.fault_app import fault_app, hang_at
from tests.device_data import FMNIST_CLASSES, skewed_fmnist_folders
from tests.test_deploy_device_data import DeviceDeployment
from tests.test_deploy_faults import trained_rows

NODES = 5
"""Clients of the run; node NODES is a sixth registered key with the wrong identity."""
FIRST, LATE, KILLED, HUNG = [0, 1, 2], [3, 4], 1, 0
HANG_ROUND = 2
ROUNDS, EVAL_EVERY = 6, 3
"""After the kill, rounds wait round-timeout until the link marks the dead node offline (2
missed 30 s heartbeats, about 3 rounds); the late nodes' start-up (30-40 s on a loaded 2-core
machine) overlaps them. Federated evaluation in rounds 3 and 6 (each waits for the dead node
like training does, so not in every round)."""
TIMEOUT = 15.0
"""round-timeout; task-deadline stays 0 (= round-timeout): the hung task is killed then."""
PER_NODE = 150
BASE_PORT = int(os.environ.get("FEDINIT_TEST_EDGE_FLEET_PORT", "39660"))
"""SuperLink on BASE_PORT and +1, nodes on +10..+15; the environment moves them."""


def wrong_identity(dep: DeviceDeployment) -> list[str]:
    """The sixth node's command: registered, but it says num-partitions=7."""
    cmd = dep.node_command(NODES)
    at = cmd.index("--node-config") + 1
    was = f"partition-id={NODES} num-partitions={NODES}"
    assert was in cmd[at], cmd[at]
    cmd[at] = cmd[at].replace(was, "partition-id=1 num-partitions=7")
    return cmd


@pytest.mark.slow
def test_an_edge_fleet_of_own_data_late_dead_wrong_and_hung_nodes_completes(
        tmp_path: Path) -> None:
    t0 = time.monotonic()
    data = load_dataset("fashion-mnist", str(default_data_dir("fashion-mnist")))
    folders = skewed_fmnist_folders(tmp_path / "data", data.train_x, data.train_y, NODES,
                                    per_node=PER_NODE, seed=0)
    dep = DeviceDeployment(tmp_path / "deploy", NODES + 1, base_port=BASE_PORT,
                           num_partitions=NODES)
    dep.folders = [*folders, folders[KILLED]]
    child_pid_file = tmp_path / "hung-child.pid"
    app = fault_app(tmp_path / "app", hang_at(HANG_ROUND, HUNG, child_pid_file))
    out = tmp_path / "out"
    try:
        dep.up(start=FIRST)
        registry = json.loads(dep.registry.read_text())
        (wrong,) = [int(n) for n, i in registry.items() if i == NODES]
        del registry[str(wrong)]  # registered with the SuperLink, no client of the run
        dep.registry.write_text(json.dumps(registry))
        cfg = {"dataset": "device", "device-classes": ",".join(FMNIST_CLASSES),
               "device-mean": "0.2860", "device-std": "0.3530",
               "max-examples-per-client": 1000, "num-clients": NODES, "min-clients": 3,
               "fraction-train": 1.0, "num-server-rounds": ROUNDS, "eval-every": EVAL_EVERY,
               "local-epochs": 1, "seed": 0, "personal-eval-every": 0,
               "node-wait-timeout": 60.0, "round-timeout": TIMEOUT,
               "node-registry": str(dep.registry), "output-dir": str(out)}
        run = FlwrRun(dep, "run", cfg, app)
        try:
            run.run_id()
            wait_rounds(out, 1, 240, run)
            kill_process(dep, f"supernode-{KILLED}")
            for i in LATE:
                dep.start_node(i)
            dep.start_node(NODES, cmd=wrong_identity(dep), name="supernode-wrong")
            status = run.wait(300)
        finally:
            run.stop()
        text = run.text()
        hung_status = json.loads(dep.executor_status(HUNG).read_text())
        hung_log = (dep.logs / f"supernode-{HUNG}.log").read_text(errors="replace")
    finally:
        dep.stop()
        stop_pids(pids_mentioning(str(tmp_path)))
    wall = time.monotonic() - t0

    rows = trained_rows(out)
    table = [(r["round"], r["clients-trained"], round(r["collect-seconds"], 1),
              round(r["round-seconds"], 1), r["num-missing"], r["num-rejected"],
              r.get("fed-eval-clients"), None if r.get("test-acc") is None
              else round(r["test-acc"], 3)) for r in rows]
    print(f"\n(round, clients trained, collect-s, round-s, missing, rejected, fed-eval "
          f"clients, test-acc) {table}; node {KILLED} killed, nodes {LATE} and the wrong "
          f"node started after round 1; client {HUNG} hung in round {HANG_ROUND}; {wall:.0f}s")
    assert status == "finished:completed", text[-3000:]
    assert [r["round"] for r in rows] == list(range(1, ROUNDS + 1)), table
    assert rows[0]["clients-trained"] == FIRST, table
    # The late nodes took part; the killed one not after it died.
    assert all(any(i in r["clients-trained"] for r in rows) for i in LATE), table
    assert all(KILLED not in r["clients-trained"] for r in rows[1:]), table
    # The wrong node: refused once, never asked again.
    assert text.count(f"refused node {wrong}: it has num-partitions=7") == 1, text[-3000:]
    # Replies are waited for at most round-timeout (+ the model's push and the last pull).
    assert all(r["collect-seconds"] < TIMEOUT + 3.0 for r in rows[1:]), table
    # The hung task was killed at its deadline with its child and answered with an error;
    # the node trained again afterwards.
    assert child_pid_file.exists(), "the hang was never reached"
    assert HUNG not in rows[HANG_ROUND - 1]["clients-trained"], table
    assert "task exceeded task-deadline=" in hung_log, hung_log[-3000:]
    assert hung_status["tasks_timed_out"] == 1, hung_status
    assert any(HUNG in r["clients-trained"] for r in rows[HANG_ROUND:]), table
    # The server holds no data: every evaluated round's accuracy is federated.
    (summary_file,) = out.glob("*/summary.json")
    assert json.loads(summary_file.read_text())["eval-source"] == "federated"
    evaluated = [r for r in rows if r.get("test-acc") is not None]
    assert [r["round"] for r in evaluated] == list(range(EVAL_EVERY, ROUNDS + 1, EVAL_EVERY))
    assert all(r["fed-eval-clients"] > 0 for r in evaluated), table
