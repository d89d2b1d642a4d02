"""The deployment: timeouts and deadlines, how many clients and replies a run needs, failed
rounds, over-selection, and where results, state and the node registry live."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedinit.config.errors import bad_value


@dataclass(frozen=True)
class FleetConfig:
    """``output-dir`` .. ``node-registry``, typed (names: keys with '-' -> '_')."""

    output_dir: str
    tracking: str
    round_timeout: float
    node_wait_timeout: float
    task_deadline: float
    min_clients: int
    min_replies: int
    over_select: float
    max_failed_rounds: int
    resume_dir: str
    client_state_dir: str
    simulation_client_state: str
    node_registry: str


def check_min_clients(f: FleetConfig, num_clients: int | None) -> None:
    """The start waits for 0 (all) up to every client (None: the count is not known yet, the
    upper bound waits for it)."""
    if not 0 <= f.min_clients <= (f.min_clients if num_clients is None else num_clients):
        raise bad_value("min-clients", f.min_clients,
                        f"0 (all) to num-clients={num_clients} clients to start with")


def check_task_deadline(f: FleetConfig) -> None:
    """A node's task deadline in seconds (0: the round timeout)."""
    if f.task_deadline < 0:
        raise bad_value("task-deadline", f.task_deadline,
                        "a number of seconds > 0, or 0 for round-timeout")


def check_over_select_value(f: FleetConfig) -> None:
    """``over-select`` on its own; what it needs of the others in ``cross.check_over_select``."""
    if not 0.0 <= f.over_select < math.inf:
        raise bad_value("over-select", f.over_select,
                        "a finite number >= 0 (0 turns over-selection off)")


def check_output_dir(f: FleetConfig) -> None:
    """Results need somewhere to go."""
    if not f.output_dir:
        raise bad_value("output-dir", f.output_dir, "a non-empty directory path")
