"""A node's ``slowdown``: its training stretched to FACTOR x its real compute time, so a test
or demo can have a slow device on a fast machine.

The factor is the node's own setting (node config ``slowdown``, which ``fedinit.node.launch
--slowdown`` writes), never the run's. The node trains, builds its reply, then sleeps
(FACTOR - 1) x the measured training time before it hands the reply back: the reply's
``compute-seconds`` is the real (unstretched) training time, the wall time the server sees is
FACTOR x it. Light on purpose: ``fedinit.node.launch`` imports it before torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

KEY = "slowdown"
"""The node config key (``--node-config "... slowdown=10"``)."""


class SlowdownError(ValueError):
    """A slowdown factor that is not a finite number >= 1."""


def check_factor(value: Any) -> float:
    """``value`` as a factor >= 1, else one line naming it and what is allowed."""
    try:
        factor = float(value)
    except (TypeError, ValueError):
        factor = math.nan
    if isinstance(value, bool) or not (math.isfinite(factor) and factor >= 1.0):
        raise SlowdownError(f"slowdown {value!r} is not allowed; allowed: a number >= 1 "
                            "(1: the node's real speed)")
    return factor


def factor_of(node_config: Mapping[str, Any]) -> float:
    """The node's slowdown factor (1 when its node config names none)."""
    return check_factor(node_config[KEY]) if KEY in node_config else 1.0


def stretch(factor: float, trained_seconds: float,
            sleep: Callable[[float], None] | None = None) -> float:
    """Sleep (factor - 1) x ``trained_seconds`` (``time.sleep`` unless ``sleep``); the
    seconds slept."""
    extra = max(0.0, (factor - 1.0) * trained_seconds)
    if extra > 0:
        (sleep or time.sleep)(extra)
    return extra
