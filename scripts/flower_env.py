"""Environment for every Flower process this project starts: offline, quiet, on our venv.

Flower's runtime dependency installation, telemetry and update checks would try the internet;
they are turned off here, and the venv's ``bin`` goes first on PATH because ``flwr run``
starts ``flower-superlink`` (and the links start ``flower-superexec``) by name.

Ray, which the simulation starts, takes the machine's network address as its node address
and then listens on all interfaces (gcs_server, raylet, object manager, workers), with no
authentication. Unless the user attaches to a cluster on purpose (``RAY_ADDRESS`` set), Ray
is told this is a one-machine setup, so its node address is 127.0.0.1 and every Ray
service binds loopback only (``ray._private.services.get_node_ip_address``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from scripts.superlink_port import CONTROL_PORT_ENV, HTTP_PORT_ENV, checkout_ports

REPO = Path(__file__).resolve().parents[1]

OFFLINE_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONUNBUFFERED": "1",
}

RAY_SINGLE_MACHINE = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for multi-machine clusters (ray_constants.ENABLE_RAY_CLUSTER); "0" makes its
node address loopback, so its services listen on 127.0.0.1 only."""


def flower_env(flwr_home: Path | None = None, **extra: str) -> dict[str, str]:
    """A copy of os.environ with the offline settings, the venv on PATH, FLWR_HOME set and
    this checkout's own local SuperLink ports (unless the caller's environment sets ports)."""
    env = dict(os.environ)
    env.update(OFFLINE_ENV)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["FLWR_HOME"] = str(flwr_home or Path(env.get("FLWR_HOME", REPO / ".flwr")))
    http, control = checkout_ports(REPO)
    env.setdefault(HTTP_PORT_ENV, http)
    env.setdefault(CONTROL_PORT_ENV, control)
    env.update(extra)
    if not env.get("RAY_ADDRESS"):
        env.setdefault(RAY_SINGLE_MACHINE, "0")
    return env
