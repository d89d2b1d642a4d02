"""Environment for every Flower process this project starts: offline, quiet, on our venv.

Flower's runtime dependency installation, telemetry and update checks are turned off and
Ray's services kept on loopback by ``fedinit.flower_compat.offline_env`` (``offline``, ``loopback``,
each behind its guard: ``docs/flower_compat.md``); the venv's ``bin`` goes first on PATH
because ``flwr run`` starts ``flower-superlink`` (and the links start ``flower-superexec``) by name.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fedinit.cli.superlink_port import CONTROL_PORT_ENV, HTTP_PORT_ENV, checkout_ports
from fedinit.flower_compat import offline_env
from fedinit.flower_compat.offline_env import RAY_SINGLE_MACHINE

REPO = Path(__file__).resolve().parents[2]

OFFLINE_ENV = {**offline_env.OFFLINE_ENV, "PYTHONUNBUFFERED": "1"}
"""What every Flower process gets (``flower_setup`` writes the same into the venv's activate)."""
__all__ = ["OFFLINE_ENV", "RAY_SINGLE_MACHINE", "REPO", "flower_env"]


def flower_env(flwr_home: Path | None = None, **extra: str) -> dict[str, str]:
    """A copy of os.environ with the offline settings, the venv on PATH, FLWR_HOME set and
    this checkout's own local SuperLink ports (unless the caller's environment sets ports)."""
    env = dict(os.environ)
    offline_env.offline(env)
    env["PYTHONUNBUFFERED"] = "1"
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env["FLWR_HOME"] = str(flwr_home or Path(env.get("FLWR_HOME", REPO / ".flwr")))
    http, control = checkout_ports(REPO)
    env.setdefault(HTTP_PORT_ENV, http)
    env.setdefault(CONTROL_PORT_ENV, control)
    env.update(extra)
    return offline_env.loopback(env)
