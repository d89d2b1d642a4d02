"""Simulated clients keep their state in files only: the wire key and the directory.

Flower's simulation engine keeps every simulated node's ``Context`` in the simulation
process, so state kept in ``context.state`` grows by N x model size there. The ServerApp, which
alone can tell a simulation from a deployment (``server_app/engine_facts.py``), names in every
train message the directory where simulated clients keep their state; a client that is given
one reads its state from there and writes it back, holding nothing between participations.
"""

from __future__ import annotations

from pathlib import Path

STATE_ROOT = "client-state-root"
"""Train-config key: the absolute state directory of simulated clients (absent: deployment)."""
RUN_SUBDIR = "client-state"
"""Where in the run directory the state lives when ``client-state-dir`` is not set."""


def state_root(client_state_dir: str, run_dir: Path) -> Path:
    """``client-state-dir`` when set, else ``<run dir>/client-state`` (so a resume of the run
    directory finds it), as an absolute path: the clients need not share the server's cwd."""
    return Path(client_state_dir).resolve() if client_state_dir else run_dir.resolve() / RUN_SUBDIR
