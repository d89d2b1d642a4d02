"""Process deployment on 127.0.0.1 (gRPC Fleet API, TLS, SuperNode auth) via deploy_local.py.

A deployment and a simulation of the same config and seed give the same per-round numbers:
sampling is by client id, partitions and initialisation are seeded, and deploy_local.py runs
each SuperNode's torch on one thread as the simulation's one-CPU Ray actors do.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedinit.cli.deploy_local import Deployment, pids_mentioning
from fedinit.cli.flower_env import REPO
from tests.deploy_helpers import (
    DEPLOY_LOCAL,
    SIMULATE,
    diffs,
    rounds,
    run_dir,
    sim_env,
    stop_local_superlink,
)

EXPERIMENT = ["num-server-rounds=3", "fraction-train=1.0", "train-limit=3000", "seed=0"]
# Same torch, same thread count, same data order and seeds: the runs differ only where the
# server sums float32 client models in reply-arrival order, which differs between runs.
# Measured over runs: 0 (same order) up to 3e-8 relative (divergence); allowed: 1e-5 relative for
# losses and divergence, 5e-4 (5 of 10,000 test images) for accuracy.
TOLERANCE = {"test-acc": 5e-4, "test-loss": 1e-5, "divergence": 1e-5, "train-loss": 1e-5}


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[tuple[list[dict[str, Any]], float]]:
    """The simulation of EXPERIMENT, run once for both executors: (its rounds, seconds)."""
    home, out = tmp_path_factory.mktemp("sim-home"), tmp_path_factory.mktemp("sim-out")
    try:
        t0 = time.monotonic()
        sim = subprocess.run([*SIMULATE, "num-clients=3", *EXPERIMENT, f"output-dir={out}"],
                             env=sim_env(home), capture_output=True, text=True, timeout=600,
                             check=False)
        wall = time.monotonic() - t0
        assert sim.returncode == 0, sim.stdout[-4000:] + sim.stderr[-3000:]
        yield rounds(run_dir(out)), wall
    finally:
        stop_local_superlink(home)


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["warm", "flower"])
def test_tls_auth_deployment_completes_and_equals_simulation(
        tmp_path: Path, simulated: tuple[list[dict[str, Any]], float], executor: str) -> None:
    """With the warm executor and with Flower's own (a process per message) alike."""
    work, dep_out = tmp_path / "deploy", tmp_path / "dep-out"
    t0 = time.monotonic()
    dep = subprocess.run(
        [*DEPLOY_LOCAL, "--num-nodes", "3", "--work-dir", str(work), "--base-port", "29500",
         "--executor", executor, "--run-timeout", "600", *EXPERIMENT,
         f"output-dir={dep_out}"],
        capture_output=True, text=True, timeout=900, check=False)
    dep_wall = time.monotonic() - t0
    assert dep.returncode == 0, dep.stdout[-4000:] + dep.stderr[-3000:]
    assert "TLS + SuperNode auth" in dep.stdout
    assert dep.stdout.count("deploy: registered node_key_") == 3
    assert "status finished:completed" in dep.stdout
    run = run_dir(dep_out)
    assert f"deploy: results in {run}" in dep.stdout
    assert leftovers(work, 29500) == [], "deploy_local.py left processes running"
    link_log = (work / "logs" / "superlink.log").read_text()
    assert "Starting Fleet API (gRPC-rere) on 127.0.0.1:29501" in link_log
    for i in range(3):  # each node mirrored its client's state to its own state-dir
        assert list((work / f"node-{i}" / "client-state").rglob(f"client-{i}/r*.npz")), i

    sim_rows, sim_wall = simulated
    dep_rows = rounds(run)
    diff = diffs(dep_rows, sim_rows)
    print(f"\n{executor} executor: deployment vs simulation over {len(dep_rows)} rounds: "
          "max relative diff "
          f"{ {k: float(f'{v:.3g}') for k, v in diff.items()} } (test-acc absolute); "
          f"deploy_local.py {dep_wall:.0f}s, simulate.py {sim_wall:.0f}s; round seconds "
          f"deploy {[round(r['round-seconds'], 1) for r in dep_rows]}, "
          f"sim {[round(r['round-seconds'], 1) for r in sim_rows]}")
    assert all(diff[k] <= TOLERANCE[k] for k in diff), (diff, dep_rows, sim_rows)
    assert all(r["num-replies"] == 3 for r in dep_rows)
    assert json.loads((run / "summary.json").read_text())["best-test-acc"] > 0.4


def leftovers(work: Path, base_port: int) -> list[int]:
    """Processes of a deployment: by work dir (certs, db) or by its ports (insecure nodes,
    executors and app processes name only addresses)."""
    marks = [str(work), f"127.0.0.1:{base_port // 10}", f"127.0.0.1:{base_port // 10 + 1}"]
    return sorted({pid for m in marks for pid in pids_mentioning(m)})


def wait_exit(proc: subprocess.Popen[bytes], timeout: float) -> int | None:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


@pytest.mark.slow
def test_unregistered_key_and_untrusted_ca_are_refused(tmp_path: Path) -> None:
    """Node auth refuses an unknown key; TLS refuses a node that lacks (or has another) CA."""
    dep = Deployment(tmp_path / "deploy", num_nodes=3, base_port=29540)
    other_ca = tmp_path / "other-ca"
    subprocess.run(["bash", str(REPO / "deploy" / "make_certs.sh"), str(other_ca)], check=True,
                   capture_output=True)
    bounded = ["--max-retries", "3", "--max-wait-time", "20"]
    try:
        dep.prepare()
        dep.start_link()
        node_id = dep.register(dep.node_key(0).with_suffix(".pub"))
        assert node_id > 0
        cases = {
            "unregistered": dep.node_command(1, key=dep.node_key(1), extra=bounded),
            "no-ca": dep.node_command(0, no_ca=True, extra=bounded),
            "other-ca": dep.node_command(2, root_ca=other_ca / "ca.crt", key=dep.node_key(0),
                                         extra=bounded),
        }
        t0 = time.monotonic()
        procs = {name: dep.start_node(i, cmd, name=name)
                 for i, (name, cmd) in enumerate(cases.items())}
        codes = {name: wait_exit(p.popen, 90) for name, p in procs.items()}
        elapsed = time.monotonic() - t0
        print(f"\nrefused nodes: exit codes {codes} within {elapsed:.1f}s")
        assert all(c not in (None, 0) for c in codes.values()), codes
        assert elapsed < 90
        logs = {name: p.log.read_text() for name, p in procs.items()}
        assert "Failed to activate SuperNode" in logs["unregistered"]
        for name in ("no-ca", "other-ca"):
            assert "CERTIFICATE_VERIFY_FAILED" in logs[name], logs[name][-2000:]
        link_log = dep.procs[0].log.read_text()
        assert "No SuperNode found with the given public key" in link_log
        ls = subprocess.run(["flwr", "supernode", "ls", "fedinit-local", "--format", "json"],
                            env=dep.cli_env(), capture_output=True, text=True, check=False)
        assert str(node_id) in ls.stdout  # only the registered key is known to the link
        assert ls.stdout.count('"node-id"') == 1, ls.stdout
    finally:
        dep.stop()
    assert leftovers(tmp_path / "deploy", 29540) == []


@pytest.mark.slow
def test_interrupt_stops_every_started_process(tmp_path: Path) -> None:
    """SIGTERM (like Ctrl-C) during the run: deploy_local.py exits and leaves nothing behind."""
    work = tmp_path / "deploy"
    proc = subprocess.Popen(
        [*DEPLOY_LOCAL, "--insecure", "--num-nodes", "2", "--work-dir", str(work),
         "--base-port", "29560", "num-server-rounds=50", "train-limit=3000",
         f"output-dir={tmp_path / 'out'}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "Successfully started run" in line:
                break
        assert len(pids_mentioning("127.0.0.1:2956")) >= 3  # link + 2 nodes (+ executors)
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        seen.append(proc.communicate(timeout=60)[0])
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(seen)
    assert proc.returncode == 130, out[-3000:]
    assert "deploy: interrupted" in out
    time.sleep(1)
    assert leftovers(work, 29560) == [], out[-3000:]
