"""A simulation's Ray services listen on loopback only (slow: a real `flwr run`).

Ray takes the machine's network address as its node address and would listen on all
interfaces (gcs_server, raylet, object manager, workers: unauthenticated). ``flower_env``
tells Ray it is a one-machine setup unless ``RAY_ADDRESS`` attaches to a cluster on purpose.
The test samples ``ss -ltnp`` while a short simulation runs and keeps the listening sockets of
the processes that carry this test's private SuperLink port in their environment.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedinit.cli.flower_env import flower_env
from tests.conftest import kill_local_superlink

HTTP_PORT, CONTROL_PORT = "39891", "39893"  # its own: no other test or bench uses these
MARKER = f"FLWR_LOCAL_SUPERLINK_HTTP_API_PORT={HTTP_PORT}".encode()
LOOPBACK = ("127.", "[::1]", "[::ffff:127.")


def our_pids() -> set[int]:
    """Processes started for this test's simulation: their environment names its port."""
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if MARKER in Path(f"/proc/{entry}/environ").read_bytes():
                    pids.add(int(entry))
    return pids


def listening(pids: set[int]) -> set[tuple[str, str]]:
    """(local address, process name) of every TCP listener owned by ``pids``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=False).stdout
    found = set()
    for line in out.splitlines():
        fields = line.split()
        for pid in pids:
            if f"pid={pid}," in line:
                name = fields[-1].split('"')[1] if '"' in fields[-1] else "?"
                found.add((fields[3], name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_simulation_ray_listens_on_loopback_only(tmp_path: Path) -> None:
    env = flower_env(tmp_path / "flwr-home", FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=HTTP_PORT,
                     FLWR_LOCAL_CONTROL_API_PORT=CONTROL_PORT)
    env.pop("RAY_ADDRESS", None)
    kill_local_superlink(HTTP_PORT)  # the SuperLink must start with this environment
    seen: set[tuple[str, str]] = set()
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedinit.cli.simulate", "num-clients=2",
             "fraction-train=1.0", "num-server-rounds=2", "train-limit=400", "local-epochs=1",
             f"output-dir={tmp_path / 'out'}"], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None and time.monotonic() - t0 < 300:
            seen |= listening(our_pids())
            time.sleep(0.5)
        output = proc.communicate(timeout=60)[0]
    finally:
        kill_local_superlink(HTTP_PORT)
    print(f"simulation took {time.monotonic() - t0:.1f} s; listeners: {sorted(seen)}")
    assert proc.returncode == 0, output[-3000:]
    ray = {(a, n) for a, n in seen if not n.startswith("flower-")}
    assert any(n in ("gcs_server", "raylet") for _, n in ray), sorted(seen)  # sampled Ray
    assert not [(a, n) for a, n in ray if not a.startswith(LOOPBACK)], sorted(seen)
