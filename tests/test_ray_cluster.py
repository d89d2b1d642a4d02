"""Flower's simulation attached to an existing Ray cluster (`ray start --head`), not its own.

flwr 1.39 passes only num-cpus/num-gpus/logging-level/log-to-driver of `--federation-config`
to `ray.init`, never an address; `ray.init()` without one connects to RAY_ADDRESS (or, on the
head machine, to the cluster `ray start` recorded in its temp dir). So the cluster is chosen
by the environment of the process that runs the simulation: here the local SuperLink that
`flwr run` starts, and its `flwr-simulation` child. The cluster is started with its own temp
dir and ports and stopped by its process group, never with `ray stop` (which would stop every
Ray instance on a shared machine).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.flower_env import flower_env
from tests.conftest import free_ports, kill_local_superlink

HTTP_PORT, CONTROL_PORT = "39591", "39593"
RAY = str(Path(sys.executable).parent / "ray")
JOBS = """
import json, os, ray
from ray._private import state
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
print("JOBS", json.dumps({"me": os.getpid(), "resources": ray.cluster_resources(),
                          "jobs": [{"pid": j["DriverPid"], "dead": j["IsDead"]}
                                   for j in state.jobs()]}))
"""


def cluster_info(env: dict[str, str]) -> dict[str, object]:
    """Ask the cluster (as a short-lived driver) for its resources and its job table."""
    out = subprocess.run([sys.executable, "-c", JOBS], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    lines = [x for x in out.stdout.splitlines() if x.startswith("JOBS ")]
    assert lines, out.stdout[-2000:] + out.stderr[-2000:]
    return dict(json.loads(lines[0][5:]))


def processes_under(temp_dir: Path) -> list[int]:
    """Processes of this cluster: their command line names its private temp dir."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if str(temp_dir).encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
    return pids


@pytest.fixture
def ray_head(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], Path]]:
    """A one-machine Ray cluster (2 CPUs) on private ports; yields (address, env, logs dir)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))  # Ray's socket paths are short
    names = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
             "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port",
             "ray-client-server-port")
    gcs, *chosen = free_ports(1 + len(names))
    ports = {f"--{k}": port for k, port in zip(names, chosen, strict=True)}
    env = flower_env(tmp_path / "flwr-home", RAY_ADDRESS=f"127.0.0.1:{gcs}",
                     RAY_USAGE_STATS_ENABLED="0")
    log = (tmp_path / "ray-head.log").open("w")
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", f"--port={gcs}", "--num-cpus=2",
         "--node-ip-address=127.0.0.1",
         "--disable-usage-stats", "--include-dashboard=false", f"--temp-dir={temp_dir}",
         *(f"{k}={v}" for k, v in ports.items())],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            if head.poll() is not None:  # a head that died never answers: say why, at once
                log.flush()
                pytest.fail("ray start exited: "
                            + (tmp_path / "ray-head.log").read_text(errors="replace")[-2000:])
            try:
                cluster_info(env)
                break
            except (AssertionError, subprocess.TimeoutExpired):
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)
        yield f"127.0.0.1:{gcs}", env, temp_dir
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(60)
        for pid in processes_under(temp_dir):  # anything `ray start` left behind, by pid
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_simulation_runs_on_an_existing_ray_cluster(
        ray_head: tuple[str, dict[str, str], Path], tmp_path: Path) -> None:
    address, env, temp_dir = ray_head
    before = cluster_info(env)
    assert before["resources"]["CPU"] == 2.0
    env = {**env, "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": HTTP_PORT,
           "FLWR_LOCAL_CONTROL_API_PORT": CONTROL_PORT}
    out = tmp_path / "out"
    kill_local_superlink(HTTP_PORT)  # the SuperLink must start with RAY_ADDRESS in its env
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "scripts.simulate", "num-clients=4",
             "fraction-train=0.5", "num-server-rounds=2", "train-limit=2000",
             f"output-dir={out}"], env=env, capture_output=True, text=True, timeout=900,
            check=False)
    finally:
        kill_local_superlink(HTTP_PORT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The simulation was a driver of THIS cluster: one new job, not our probe, finished by
    # now; and the cluster outlived it (attached, not owned).
    after = cluster_info(env)
    known = {j["pid"] for j in before["jobs"]} | {after["me"]}
    sim_jobs = [j for j in after["jobs"] if j["pid"] not in known]
    assert len(sim_jobs) == 1 and sim_jobs[0]["dead"], after
    assert after["resources"]["CPU"] == 2.0
    # Its ClientApps ran in this cluster's workers: their logs are in the cluster's temp dir.
    worker_logs = list(temp_dir.glob("session_*/logs/worker-*"))
    assert any("ClientAppActor" in p.read_text(errors="replace") for p in worker_logs), \
        [p.name for p in worker_logs]
    (run_dir,) = list(out.iterdir())
    assert json.loads((run_dir / "summary.json").read_text())["rounds"] == 2
