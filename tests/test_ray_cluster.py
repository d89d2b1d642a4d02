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

import numpy as np
import pytest

from fedinit.cli.flower_env import flower_env
from tests.conftest import free_ports, kill_local_superlink

HTTP_PORT, CONTROL_PORT = "39591", "39593"
RAY = str(Path(sys.executable).parent / "ray")
JOBS = """
import json, os, ray
from ray._private import state
ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR")
print("JOBS", json.dumps({"me": os.getpid(), "resources": ray.cluster_resources(),
                          "nodes": sum(n["Alive"] for n in ray.nodes()),
                          "actors": [[a["Address"]["NodeID"], a["ActorClassName"]]
                                     for a in state.actors().values()],
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


NODE_PORTS = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
              "dashboard-agent-grpc-port", "metrics-export-port", "runtime-env-agent-port")
"""The ports every Ray node binds; each node on this machine gets its own."""


HEAD_PORTS = NODE_PORTS + ("ray-client-server-port",)
"""The head binds one more: Ray Client's server."""


def start_node(args: list[str], env: dict[str, str], log: Path,
               ports: list[int] | None = None) -> subprocess.Popen[bytes]:
    """`ray start ... --block` with its own free ports (``ports``, or chosen here), in its own
    process group."""
    names = HEAD_PORTS if "--head" in args else NODE_PORTS
    ports = ports if ports is not None else free_ports(len(names))
    with log.open("w") as out:
        return subprocess.Popen(
            [RAY, "start", "--block", *args, "--node-ip-address=127.0.0.1",
             "--disable-usage-stats", *(f"--{k}={v}" for k, v in zip(names, ports, strict=True))],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


RAY_STARTUP_TIMEOUT = "timed out during startup"
"""What `ray start` says when its raylet did not register with the GCS within Ray's fixed 30 s
(`Node.__init__` in Ray 2.55, no setting moves it): on a busy machine (CI, 2026-12-05, beside the
Docker images' builds and an emulated arm64 node) a head that is fine but slow."""
START_TRIES = 3
"""Cluster starts tried when a node times out so or loses a port; any other failure fails
at once."""


PORT_TAKEN = ("Failed to start the grpc server", "used by other components",
              "Address already in use", "Failed to bind to address")
"""A port chosen free was bound by another process before Ray bound it (CI, 2026-12-06: the
GCS port 45007, free when chosen, was taken when gcs_server started; CI, 2026-12-07: the
head's log said only "ray_client_server [exit code=1]", its own .err log "Failed to bind to
address"): fresh ports fix it."""


def exited_components_logs(tail: str, temp_dir: Path) -> str:
    """The ends of the .err logs of the Ray subprocesses a `ray start` names as exited
    ("ray_client_server [exit code=1]"): the head's own log does not say why they died."""
    logs = temp_dir / "session_latest" / "logs"
    out = []
    for line in tail.splitlines():
        if "[exit code=" in line:
            name = line.split("--")[-1].split("[exit code=")[0].strip()
            for err in sorted(logs.glob(f"{name}*.err")) if name else []:
                out.append(f"{err.name}: " + err.read_text(errors="replace")[-600:])
    return "\n".join(out)


class NodeStartRetryable(Exception):
    """A `ray start` gave up waiting for its own raylet (RAY_STARTUP_TIMEOUT) or lost one of its
    ports to another process (PORT_TAKEN): a try on fresh ports can succeed."""


def wait_for_nodes(nodes: list[tuple[subprocess.Popen[bytes], Path]], env: dict[str, str],
                   count: int, temp_dir: Path) -> None:
    """Until the cluster answers with ``count`` live nodes; a node that exited fails at once
    with its log (before: a dead head meant a 120 s wait), or raises NodeStartRetryable when
    Ray's own start-up wait ran out or a port was taken."""
    deadline = time.monotonic() + 180
    while True:
        for proc, log in nodes:
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                tail += exited_components_logs(tail, temp_dir)
                if any(m in tail for m in (RAY_STARTUP_TIMEOUT, *PORT_TAKEN)):
                    raise NodeStartRetryable(f"{log.name}: {tail[-600:]}")
                pytest.fail(f"ray start exited ({log.name}): {tail}")
        try:
            if cluster_info(env)["nodes"] == count:
                return
        except (AssertionError, subprocess.TimeoutExpired):
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"the Ray cluster did not show {count} live nodes in 180 s")
        time.sleep(2)


def stop_cluster(nodes: list[tuple[subprocess.Popen[bytes], Path]], temp_dir: Path) -> None:
    """Each `ray start` by its process group, then whatever it left behind, by pid (never
    `ray stop`, which would stop every Ray instance on a shared machine)."""
    for proc, _ in reversed(nodes):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(60)
    for pid in processes_under(temp_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(temp_dir, ignore_errors=True)


def start_cluster(count: int, tmp_path: Path, attempt: int
                  ) -> tuple[list[tuple[subprocess.Popen[bytes], Path]], str, dict[str, str],
                             Path]:
    """One try at a cluster of ``count`` nodes, on fresh ports and a fresh temp dir; returns
    (nodes, address, env, temp dir) once every node is live, stopping what it started when
    it fails."""
    temp_dir = Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp"))  # Ray's socket paths are short
    # The GCS port and the head's other ports in one choice: chosen in two calls, the second
    # could hand out the first's port again (CI, 2026-12-04: "gcs_server is trying to use a
    # port number 45001 that is used by other components", the object manager's).
    gcs, *head_ports = free_ports(1 + len(HEAD_PORTS))
    env = flower_env(tmp_path / "flwr-home", RAY_ADDRESS=f"127.0.0.1:{gcs}",
                     RAY_USAGE_STATS_ENABLED="0")
    cpus = 2 if count == 1 else 1
    head_log = tmp_path / f"ray-head-{attempt}.log"
    nodes = [(start_node(["--head", f"--port={gcs}", f"--num-cpus={cpus}",
                          "--include-dashboard=false", f"--temp-dir={temp_dir}"],
                         env, head_log, head_ports), head_log)]
    try:
        wait_for_nodes(nodes, env, 1, temp_dir)
        for i in range(1, count):  # worker nodes join the head's session (and its temp dir)
            log = tmp_path / f"ray-worker-{i}-{attempt}.log"
            nodes.append((start_node([f"--address=127.0.0.1:{gcs}", f"--num-cpus={cpus}"],
                                     env, log), log))
        wait_for_nodes(nodes, env, count, temp_dir)
    except BaseException:
        stop_cluster(nodes, temp_dir)
        raise
    return nodes, f"127.0.0.1:{gcs}", env, temp_dir


@pytest.fixture
def ray_cluster(request: pytest.FixtureRequest, tmp_path: Path
                ) -> Iterator[tuple[str, dict[str, str], Path]]:
    """A Ray cluster on this machine, on private ports: ``request.param`` nodes (default 1,
    a head with 2 CPUs; 2: a head and a worker node with 1 CPU each); yields (address, env,
    the cluster's temp dir)."""
    count = getattr(request, "param", 1)
    for attempt in range(1, START_TRIES + 1):
        try:
            nodes, address, env, temp_dir = start_cluster(count, tmp_path, attempt)
            break
        except NodeStartRetryable as lost:
            if attempt == START_TRIES:
                pytest.fail(f"ray start failed {START_TRIES} times; last: {lost}")
            print(f"\nray start timed out or lost a port (try {attempt} of {START_TRIES}), "
                  f"starting again on fresh ports: {str(lost)[:200]}")
    try:
        yield address, env, temp_dir
    finally:
        stop_cluster(nodes, temp_dir)


def simulate(env: dict[str, str], out: Path, num_clients: int, fraction: float) -> None:
    """A 2-round simulation by the project's own command, on our test ports; the local
    SuperLink is stopped before (it must start with this ``env``) and after."""
    env = {**env, "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": HTTP_PORT,
           "FLWR_LOCAL_CONTROL_API_PORT": CONTROL_PORT}
    kill_local_superlink(HTTP_PORT)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "fedinit.cli.simulate", f"num-clients={num_clients}",
             f"fraction-train={fraction}", "num-server-rounds=2", "train-limit=2000",
             f"output-dir={out}"], env=env, capture_output=True, text=True, timeout=900,
            check=False)
    finally:
        kill_local_superlink(HTTP_PORT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def final_model(out: Path) -> list[bytes]:
    (run_dir,) = list(out.iterdir())
    with np.load(run_dir / "final_model.npz") as z:
        return [z[k].tobytes() for k in z.files]


@pytest.mark.slow
def test_simulation_runs_on_an_existing_ray_cluster(
        ray_cluster: tuple[str, dict[str, str], Path], tmp_path: Path) -> None:
    address, env, temp_dir = ray_cluster
    before = cluster_info(env)
    assert before["resources"]["CPU"] == 2.0
    out = tmp_path / "out"
    simulate(env, out, num_clients=4, fraction=0.5)
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


@pytest.mark.slow
@pytest.mark.parametrize("ray_cluster", [2], indirect=True)
def test_simulation_spans_two_ray_nodes_and_matches_one_machine(
        ray_cluster: tuple[str, dict[str, str], Path], tmp_path: Path) -> None:
    """docs/scaling.md's multi-node recipe, both nodes on this machine: a head and a worker
    node with 1 CPU each, so Flower's pool holds two actors and Ray must place one on each;
    the model is the one a single machine's run makes, bit for bit."""
    _address, env, _temp_dir = ray_cluster
    spanned = tmp_path / "two-nodes"
    simulate(env, spanned, num_clients=4, fraction=1.0)
    info = cluster_info(env)
    nodes_with_actors = {node for node, cls in info["actors"] if cls == "ClientAppActor"}
    assert len(nodes_with_actors) == 2, info["actors"]
    assert info["nodes"] == 2  # both nodes outlived the run

    alone = tmp_path / "one-machine"  # Flower's own Ray, started and stopped by the run
    simulate({k: v for k, v in env.items() if k != "RAY_ADDRESS"}, alone, num_clients=4,
             fraction=1.0)
    actors_after = [cls for _node, cls in cluster_info(env)["actors"]]
    assert actors_after.count("ClientAppActor") == 2, "the one-machine run used the cluster"
    assert final_model(spanned) == final_model(alone)


def exited_node(log: Path, text: str) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """A `ray start` that has already exited, its log saying ``text``."""
    log.write_text(text)
    proc = subprocess.Popen(["true"])
    proc.wait()
    return [(proc, log)]


def test_a_ray_start_that_timed_out_or_lost_a_port_is_told_apart_from_one_that_failed(
        tmp_path: Path) -> None:
    """The fixture starts the cluster again only after Ray's own 30 s start-up wait ran out or
    a port it was given was taken meanwhile; any other failure fails the test at once."""
    env = dict(os.environ)
    retryable = {
        "timed-out.log": "Exception: The current node timed out during startup. This could ...",
        "port-clash.log": "ValueError: gcs_server is trying to use a port number 45001 that is "
                          "used by other components ...",
        "gcs-port.log": "Check failed: server_ Failed to start the grpc server. The specified "
                        "port is 45007.",
    }
    for name, text in retryable.items():
        with pytest.raises(NodeStartRetryable, match=name):
            wait_for_nodes(exited_node(tmp_path / name, text), env, 1, tmp_path)
    # The head names only the subprocess that died; why is in that subprocess's own log.
    head = exited_node(tmp_path / "client-server.log",
                       "ERR scripts.py:1206 -- ray_client_server [exit code=1]\n")
    with pytest.raises(pytest.fail.Exception, match="ray start exited .client-server.log"):
        wait_for_nodes(head, env, 1, tmp_path)
    logs = tmp_path / "session_latest" / "logs"
    logs.mkdir(parents=True)
    (logs / "ray_client_server.err").write_text(
        "RuntimeError: Failed to bind to address 127.0.0.1:56903; set GRPC_VERBOSITY=debug")
    with pytest.raises(NodeStartRetryable, match="Failed to bind"):
        wait_for_nodes(head, env, 1, tmp_path)
    failed = exited_node(tmp_path / "failed.log",
                         "ModuleNotFoundError: No module named 'ray._raylet'")
    with pytest.raises(pytest.fail.Exception, match="ray start exited .failed.log"):
        wait_for_nodes(failed, env, 1, tmp_path)
