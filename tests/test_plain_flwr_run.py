"""Plain `flwr run . --stream` as the README tells a Flower user to run it, and a foreign
SuperLink on the project's port (slow: they start SuperLinks and Ray)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedinit.cli.flower_env import REPO, flower_env
from fedinit.cli.superlink_port import CONTROL_PORT_ENV, HTTP_PORT_ENV, listening, superlinks_on
from fedinit.config import load_defaults
from fedinit.scripts.flower_setup import flower_config, shell_env
from tests.conftest import SIM_CONTROL_PORT, SIM_HTTP_PORT, kill_local_superlink

SMALL = "num-server-rounds=2 train-limit=2000"  # the README's small-data override


@pytest.fixture
def user_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """What `source .venv/bin/activate` gives after scripts/setup.sh, on the tests' ports and
    a private Flower home (written by the same code as setup's)."""
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text(flower_config(int(load_defaults()["num-clients"])))
    env = {**os.environ, **shell_env(), "FLWR_HOME": str(home), HTTP_PORT_ENV: SIM_HTTP_PORT,
           CONTROL_PORT_ENV: SIM_CONTROL_PORT}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env["PATH"]
    kill_local_superlink(SIM_HTTP_PORT)
    yield env
    kill_local_superlink(SIM_HTTP_PORT)


def flwr_run(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    proc = subprocess.run(["flwr", "run", ".", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    return proc, time.monotonic() - t0


def run_status(env: dict[str, str]) -> list[str]:
    out = subprocess.run(["flwr", "ls", "--format", "json"], cwd=REPO, env=env,
                         capture_output=True, text=True, check=False).stdout
    return [r["status"] for r in json.loads(out[out.index("{"):])["runs"]]


@pytest.mark.slow
def test_plain_flwr_run_is_offline_and_completes(user_env: dict[str, str],
                                                 tmp_path: Path) -> None:
    proc, _ = flwr_run(user_env, "--stream", "--run-config",
                       f"{SMALL} output-dir='{tmp_path / 'out'}'")
    output = proc.stdout + proc.stderr
    assert "[round 2/2] acc" in output, output[-3000:]
    assert run_status(user_env) == ["finished:completed"]
    home = Path(user_env["FLWR_HOME"])
    log = (home / "local-superlink" / "superlink.log").read_text()
    assert "uv sync" not in log and "uv pip" not in log
    assert not (home / "runtime-envs").exists()  # no per-run environment


@pytest.mark.slow
def test_plain_flwr_run_on_a_wrong_sized_federation_fails_at_once(
        user_env: dict[str, str], tmp_path: Path) -> None:
    proc, seconds = flwr_run(user_env, "--stream", "--federation-config", "num-supernodes=3",
                             "--run-config", f"{SMALL} output-dir='{tmp_path / 'out'}'")
    output = proc.stdout + proc.stderr
    num_clients = load_defaults()["num-clients"]
    assert f'num-supernodes={num_clients}' in output, output[-3000:]
    assert "results:" not in output  # the run never really started
    assert run_status(user_env) == ["finished:failed"]
    assert seconds < 90, seconds  # measured 22 s on 2 busy cores (SuperLink start + Ray)


@pytest.mark.slow
def test_a_foreign_superlink_on_the_port_gets_no_run(tmp_path: Path) -> None:
    """Another checkout's or venv's SuperLink on the port the project would use is refused."""
    foreign_home = tmp_path / "foreign"
    foreign = flower_env(foreign_home, **{HTTP_PORT_ENV: SIM_HTTP_PORT,
                                          CONTROL_PORT_ENV: SIM_CONTROL_PORT})
    for key in ("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION",):
        foreign.pop(key)  # as plain `flwr run` from an unconfigured shell starts it
    kill_local_superlink(SIM_HTTP_PORT)
    deadline = time.monotonic() + 60
    while listening(int(SIM_HTTP_PORT)):  # the last test's SuperLink may still be stopping
        assert time.monotonic() < deadline
        time.sleep(0.5)
    link = subprocess.Popen(
        ["flower-superlink", "--insecure", "--simulation", "--control-api-address",
         f"127.0.0.1:{SIM_CONTROL_PORT}", "--host", "127.0.0.1", "--port", SIM_HTTP_PORT,
         "--database", str(foreign_home / "state.db"), "--disable-runtime-dependency-installation"],
        env=foreign, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while str(link.pid) not in superlinks_on(SIM_HTTP_PORT) or not _health(SIM_HTTP_PORT):
            assert time.monotonic() < deadline and link.poll() is None
            time.sleep(0.5)
        ours = flower_env(tmp_path / "ours", **{HTTP_PORT_ENV: SIM_HTTP_PORT,
                                               CONTROL_PORT_ENV: SIM_CONTROL_PORT})
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "fedinit.cli.simulate", "num-server-rounds=1",
                               f"output-dir={tmp_path / 'out'}"], cwd=REPO, env=ours,
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        assert "of another Flower home" in proc.stderr
        assert time.monotonic() - t0 < 5
        assert run_status(ours) == []  # the foreign SuperLink received nothing
    finally:
        os.killpg(link.pid, signal.SIGTERM)
        link.wait(timeout=30)


def _health(port: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as res:
            return res.status == 200
    except OSError:
        return False
