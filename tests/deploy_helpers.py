"""Shared pieces of the deployment tests: results files, process checks, a private simulation
environment, and a Docker engine that the tests install and start themselves when missing."""

from __future__ import annotations

import contextlib
import fcntl
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
from typing import Any

from fedinit.cli.deploy_local import pids_mentioning, stop_pids
from fedinit.cli.flower_env import REPO, flower_env

DEPLOY_LOCAL = [sys.executable, "-m", "fedinit.cli.deploy_local"]
SIMULATE = [sys.executable, "-m", "fedinit.cli.simulate"]
# The simulation's local SuperLink on ports of our own (not 39091/39093 nor conftest's).
SIM_HTTP_PORT, SIM_CONTROL_PORT = "39291", "39293"
COMPARED = ("test-acc", "test-loss", "divergence", "train-loss")


def deploy_three_insecure(work: Path, out: Path, base_port: int, experiment: list[str]) -> None:
    """Run ``experiment`` on a 3-node process deployment without TLS (``deploy_local.py``,
    ports ``base_port`` +0, +1, +10..+12): it completes and leaves no process behind."""
    dep = subprocess.run(
        [*DEPLOY_LOCAL, "--num-nodes", "3", "--work-dir", str(work), "--base-port",
         str(base_port), "--insecure", "--run-timeout", "300", *experiment,
         f"output-dir={out}"],
        capture_output=True, text=True, timeout=400, check=False)
    assert dep.returncode == 0, dep.stdout[-4000:] + dep.stderr[-3000:]
    assert "status finished:completed" in dep.stdout
    assert pids_mentioning(str(work)) == [], "deploy_local.py left processes running"


def run_dir(out: Path) -> Path:
    """The one results directory the ServerApp wrote under ``out``."""
    dirs = [d for d in out.iterdir() if (d / "summary.json").exists()]
    assert len(dirs) == 1, f"expected one run directory in {out}: {list(out.iterdir())}"
    return dirs[0]


def rounds(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "rounds.jsonl").read_text().splitlines()]


def diffs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, float]:
    """{metric: largest relative |a - b| over rounds} (absolute for test-acc, a fraction)."""
    assert [r["round"] for r in a] == [r["round"] for r in b]
    out = {}
    for k in COMPARED:
        worst = 0.0
        for x, y in zip(a, b, strict=True):
            u, v = float(x[k]), float(y[k])
            d = abs(u - v)
            worst = max(worst, d if k == "test-acc" else d / max(abs(u), abs(v), 1e-12))
        out[k] = worst
    return out








def sim_env(home: Path) -> dict[str, str]:
    """Environment for fedinit/cli/simulate.py with a private FLWR_HOME and local SuperLink
    ports."""
    return flower_env(home, FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=SIM_HTTP_PORT,
                      FLWR_LOCAL_CONTROL_API_PORT=SIM_CONTROL_PORT)


def stop_local_superlink(home: Path) -> None:
    """`flwr run` leaves its local SuperLink running; end the one under our FLWR_HOME."""
    stop_pids(pids_mentioning(str(home / "local-superlink")))


# ------------------------------------------------------------------- docker
DOCKER_PACKAGES = ["docker.io", "docker-compose", "debootstrap"]


ENGINE_STATE = Path(tempfile.gettempdir()) / "fedinit-test-dockerd.json"
"""The dockerd the tests started and the test processes using it (pids): two modules on two
xdist workers share one engine, and the last one out stops it (ENGINE_STATE + ".lock").
In the system's temp folder, not the checkout: a machine has one dockerd for every checkout."""


def process_alive(pid: int) -> bool:
    """``pid`` runs and is not a zombie (a dockerd another worker started, killed by this one,
    stays a zombie of that worker until it reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def is_dockerd(pid: int) -> bool:
    """``pid`` is a live dockerd (a recorded pid may since belong to another program)."""
    try:
        name = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return False
    return name.endswith(b"dockerd") and process_alive(pid)


@contextlib.contextmanager
def engine_state() -> Iterator[dict[str, Any]]:
    """ENGINE_STATE read and written back under an exclusive lock, its dead users dropped:
    {"pid": the dockerd the tests started (0: none, the engine was already there or is
    down), "users": [test processes]}."""
    with open(f"{ENGINE_STATE}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(ENGINE_STATE.read_text())
        except (OSError, ValueError):
            state = {}
        state = {"pid": int(state.get("pid", 0)),
                 "users": [u for u in state.get("users", []) if process_alive(int(u))]}
        yield state
        ENGINE_STATE.write_text(json.dumps(state))


class DockerEngine:
    """docker + docker-compose + debootstrap installed with apt and dockerd running.

    CI machines start without any of them; as root the tests install the Debian packages and
    start dockerd, and the last test process using a dockerd the tests started stops it
    (ENGINE_STATE). ``skip_reason`` is set when that is impossible (not root and no engine)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.joined = False
        self.skip_reason = ""

    def ensure(self) -> None:
        with engine_state() as state:
            if not self._engine_up():
                if os.geteuid() != 0:
                    self.skip_reason = ("no running Docker engine, and installing docker.io/"
                                        "docker-compose and starting dockerd needs root")
                    return
                state["pid"] = self._start()
            elif not is_dockerd(state["pid"]):
                state["pid"] = 0  # up, but not the one recorded: not ours to stop
            state["users"].append(os.getpid())
            self.joined = True

    def _start(self) -> int:
        """Install the packages when missing, start dockerd, wait for it; its pid."""
        if not all(shutil.which(t) for t in ("dockerd", "docker-compose", "debootstrap")):
            env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
            subprocess.run(["apt-get", "update", "-qq"], env=env, check=False,
                           capture_output=True)
            proc = subprocess.run(["apt-get", "install", "-y", "-qq", *DOCKER_PACKAGES],
                                  env=env, check=False, capture_output=True, text=True)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        log = (self.log_dir / "dockerd.log").open("wb")
        started = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self._engine_up():
                return started.pid
            if started.poll() is not None:
                break
            time.sleep(1)
        raise AssertionError("dockerd did not start: "
                             + (self.log_dir / "dockerd.log").read_text()[-2000:])

    @staticmethod
    def _engine_up() -> bool:
        if not shutil.which("docker"):
            return False
        return subprocess.run(["docker", "info"], capture_output=True, check=False,
                              timeout=30).returncode == 0

    def stop(self) -> None:
        """Leave the engine; the last user stops a dockerd the tests started (SIGTERM, then
        SIGKILL after 30 s), never one that ran before."""
        if not self.joined:
            return
        self.joined = False
        with engine_state() as state:
            state["users"].remove(os.getpid())  # one entry: this process may hold two
            pid = state["pid"]
            if state["users"] or not pid:
                return
            state["pid"] = 0
            if not is_dockerd(pid):
                return
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 30
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.5)
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


def sh(*cmd: str, timeout: float = 120, env: dict[str, str] | None = None,
       ) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output, never raise on its exit status."""
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                          check=False, env=env)


def docker_session(log_dir: Path, project: str) -> Iterator[DockerEngine]:
    """A module's Docker engine (skip when impossible) with the stack's images built from this
    checkout; at the end, the containers named after ``project`` that are left (probes whose
    `docker run` client timed out live on) are removed, and the module leaves the engine
    (DockerEngine.stop: the last user stops a dockerd the tests started).

    The images are brought up to date first (``build_images.sh`` rebuilds only an image whose
    inputs changed, a few seconds otherwise): ``compose_run.sh`` builds only missing ones,
    so a module that ran before the build test used whatever images an earlier checkout left
    on this machine (a node runtime without the namespace move: every ClientApp import
    failed)."""
    import pytest

    engine = DockerEngine(log_dir)
    try:
        engine.ensure()
        if engine.skip_reason:
            pytest.skip(engine.skip_reason)
        build = sh("bash", str(REPO / "deploy" / "build_images.sh"), timeout=3600)
        assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
        yield engine
    finally:
        if not engine.skip_reason:
            left = sh("docker", "ps", "-aq", "--filter", f"name={project}").stdout.split()
            if left:
                sh("docker", "rm", "-f", *left)
        engine.stop()


def check_published_ports(config: dict[str, Any]) -> None:
    """A resolved compose config publishes no port but the operator's page's (profile
    ``dashboard``, started only on request), and that one on the host's loopback only."""
    published = {name: svc["ports"] for name, svc in config["services"].items()
                 if svc.get("ports")}
    assert set(published) <= {"dashboard"}, f"no port may be published: {published}"
    assert all(str(p).startswith("127.0.0.1:") for p in published.get("dashboard", [])), \
        published
