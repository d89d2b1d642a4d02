"""How long one ClientApp task may run before the warm executor kills it.

A task that never returns (a data-loader deadlock, a stuck driver) would hold the node: the
SuperNode hands out its next message only once the current one is answered. The deadline
comes with the task's run config (``context.run_config``), so the operator of the run sets
it; a node may set its own (``--task-deadline``), which wins.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

KEY = "task-deadline"
ROUND_TIMEOUT = "round-timeout"


def seconds(value: Any) -> float:
    """A positive finite number of seconds, or 0 for anything else (unset, 0, a string)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0.0
    return float(value) if math.isfinite(value) and value > 0 else 0.0


def task_deadline(run_config: Mapping[str, Any], override: float = 0.0) -> float:
    """Seconds a task of this run may take; 0 means no deadline.

    ``override`` (the node's ``--task-deadline``) wins when > 0. Otherwise the run's
    ``task-deadline``, where 0 means ``round-timeout``: a reply later than that is not
    aggregated anyway, so the task gets as long as its round waits for it. A run config
    without either key (another app) gets no deadline. The server checked both keys
    (``fedinit/config/fleet.py``); values that are not positive numbers count as unset here.
    """
    if seconds(override):
        return seconds(override)
    return seconds(run_config.get(KEY)) or seconds(run_config.get(ROUND_TIMEOUT))


def timeout_reason(deadline: float) -> str:
    """The one line of the error reply that answers a task killed at its deadline."""
    return f"task exceeded {KEY}={deadline:g}s; killed"
