"""``rounds=async`` in a real TLS + node-auth deployment (slow): 4 SuperNodes, one a slow
device (``fedinit.node.launch --slowdown 10``), one killed (SIGTERM) while it trains its first task.

FedBuff must not wait for the slow node (versions are made while its task is out, so its
reply arrives stale and is weighted by s(tau) = (1 + tau)^-a), the killed node's task must be
given up at ``round-timeout`` and its slot re-sent to another client, and the run must make
all its versions. The killed node is slowed too (x30) only so that "mid-task" is a window of
seconds, not a race with its ~0.1 s of training.

SIGTERM, not SIGKILL: Flower's SuperNode deactivates itself on the way out, so the SuperLink
answers its task with ``Node Unavailable`` at once. A SIGKILLed node's task is given up only
at ``round-timeout``, which must exceed the slow node's longest task (its first, cold, x10:
~8 s on a loaded 2-core machine) while the run outlasts it: a race with the machine's speed,
so that path is tested in process on a fake clock (tests/test_async_rounds.py,
``test_a_dead_clients_task_is_lost_and_its_slot_goes_to_another_client``).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from fedinit.cli.deploy_local import Deployment, descendants, stop_pids
from testbeds.deployment_runs import FlwrRun, deployed
from tests.deploy_helpers import rounds, run_dir

BASE_PORT = 43000  # link 43000/43001, nodes 43010-43013
NODES, SLOW, KILLED = 4, 1, 2
"""With seed 0 the first dispatch (seeded choice of 3 of 4) is clients [1, 0, 2]: the slow
and the doomed node both get a task at version 0; client 3 is idle and takes a lost slot."""
VERSIONS, A, TIMEOUT = 20, 0.5, 20.0
"""TIMEOUT: only a task the SuperLink never answers waits for it; above the slow node's
longest task (its first: data, model and a cold x10 training) on a loaded machine."""
RUN = {"method": "fedavg", "rounds": "async", "num-clients": NODES, "concurrency": 3,
       "buffer-size": 2, "staleness": "poly", "staleness-a": A, "num-server-rounds": VERSIONS,
       "round-timeout": TIMEOUT, "task-deadline": 60.0, "train-limit": 2000, "batch-size": 50,
       "local-epochs": 1, "seed": 0, "eval-every": VERSIONS, "personal-eval-every": 0,
       "tracking": "off", "node-wait-timeout": 60.0}


def tails(dep: Deployment) -> str:
    return "\n".join(p.tail(12) for p in dep.procs)


def wait_for(path: Path, text: str, timeout: float, dep: Deployment) -> float:
    """When ``text`` first shows in the log at ``path`` (monotonic time)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in {path.name} within {timeout:g}s:\n{tails(dep)}")


@pytest.mark.slow
def test_async_deployment_with_a_slow_and_a_killed_node(tmp_path: Path) -> None:
    t0 = time.monotonic()
    out = tmp_path / "out"
    dep = Deployment(tmp_path / "deploy", NODES, base_port=BASE_PORT, link_state="memory",
                     slowdown={SLOW: 10.0, KILLED: 30.0})
    with deployed(dep, tmp_path):
        up = time.monotonic() - t0
        run = FlwrRun(dep, "run", {**RUN, "node-registry": str(dep.registry),
                                   "output-dir": str(out)})
        try:
            victim = next(p for p in dep.procs if p.name == f"supernode-{KILLED}")
            wait_for(victim.log, "Receiving: train message", 120, dep)
            time.sleep(1.0)  # its executor is inside the x30 training now
            tree = descendants([victim.popen.pid])
            os.kill(victim.popen.pid, signal.SIGTERM)
            try:
                victim.popen.wait(timeout=15)
            finally:
                stop_pids(tree, grace=2.0)  # what is left of it (its executor, its worker)
            dep.procs.remove(victim)
            try:
                status = run.wait(120)
            except AssertionError as err:
                raise AssertionError(f"{err}\nnode logs:\n{tails(dep)}") from None
        finally:
            run.stop()
        server_log = run.text()
    wall = time.monotonic() - t0
    rows = rounds(run_dir(out))
    print(f"\nasync deployment: up {up:.0f} s, total {wall:.0f} s; (version, buffered "
          f"[client, sent, tau, s], missing) "
          f"{[(r['round'], r['buffered'], r['num-missing']) for r in rows]}")
    assert status == "finished:completed", server_log[-3000:]
    assert [r["round"] for r in rows] == list(range(1, VERSIONS + 1))
    assert all(r["num-replies"] == 2 and r["num-rejected"] == 0 for r in rows)

    # Each buffered reply: tau = the version it arrived at (the row's round - 1) - the version
    # its task was sent, and its weight (1 + tau)^-a, both computed here.
    entries = [(r["round"], c, sent, t, s) for r in rows for c, sent, t, s in r["buffered"]]
    assert all(t == v - 1 - sent for v, _, sent, t, _ in entries)
    assert all(s == pytest.approx((1.0 + t) ** -A) for *_, t, s in entries)
    # The slow node: versions were made while each of its tasks was out (never waited for),
    # so each reply arrives stale, weighted below 1. Its tasks sent at version 0 are left
    # out: every node's first task is cold (data, model), which the slowdown does not stretch.
    slow = [(v, sent, t, s) for v, c, sent, t, s in entries if c == SLOW and sent > 0]
    assert slow, f"no reply of the slow node to a task sent after version 0: {entries}"
    assert all(t >= 1 and s < 1.0 for _, _, t, s in slow), slow
    for v, sent, _, _ in slow:
        assert [u for u, c, *_ in entries if c != SLOW and sent < u < v], (v, sent)

    # The killed node: never aggregated, its task lost, its slot re-sent to another client.
    assert all(c != KILLED for _, c, *_ in entries)
    assert sum(r["num-missing"] for r in rows) >= 1
    lost = re.search(rf"lost the task of client {KILLED} \(sent version 0\): the SuperLink "
                     rf"answered for it: Error: Node Unavailable", server_log)
    assert lost, server_log[-3000:]
    resent = re.search(r"lost task\(s\) re-sent: client\(s\) \[(\d+)", server_log[lost.end():])
    assert resent and int(resent.group(1)) != KILLED, server_log[lost.end():][-2000:]
