"""Shorter waits inside Flower 1.39's SuperNode loop, applied only where they are known.

``flwr.supernode.start_client_internal`` sleeps a hard-coded 3 s after an empty pull from
the SuperLink (an idle node notices a new round 1.5 s late on average, 3 s at worst) and
0.5 s between checks for the ClientApp's reply. Flower has no setting for either. We give
that one module a ``time`` whose ``sleep`` maps exactly those two waits to ours and passes
every other call through. An upgrade cannot break this silently: it is applied only to the
flwr version whose source was checked, and only when that source still contains both calls
(otherwise the node runs with Flower's own waits and says so); a test checks the source.
"""

from __future__ import annotations

import inspect
import time
import types
from logging import INFO, WARNING

CHECKED_FLWR = "1.39.0"
IDLE_SLEEP = 3
"""Seconds the SuperNode sleeps after a pull that brought no message (flwr 1.39.0)."""
REPLY_SLEEP = 0.5
"""Seconds between its checks for a ClientApp reply (flwr 1.39.0)."""
CALLS = (f"time.sleep({IDLE_SLEEP})", f"time.sleep({REPLY_SLEEP})")


class _Time(types.ModuleType):
    """The ``time`` module with two sleep durations replaced."""

    def __init__(self, mapping: dict[float, float]) -> None:
        super().__init__("time")
        self._mapping = mapping

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        time.sleep(self._mapping.get(seconds, seconds))


def why_not_patchable() -> str | None:
    """None when the installed SuperNode loop is the one checked; else the reason."""
    import flwr
    from flwr.supernode import start_client_internal as loop

    if flwr.__version__ != CHECKED_FLWR:
        return f"flwr {flwr.__version__} is not the checked {CHECKED_FLWR}"
    source = inspect.getsource(loop)
    missing = [c for c in CALLS if c not in source]
    if missing:
        return f"the SuperNode loop no longer contains {', '.join(missing)}"
    return None


def install(idle: float, reply: float) -> bool:
    """Make the SuperNode's idle and reply waits ``idle`` and ``reply`` seconds."""
    from flwr.supercore import log
    from flwr.supernode import start_client_internal as loop

    reason = why_not_patchable()
    if reason is not None:
        log(WARNING, "fast poll not applied (%s); the SuperNode keeps Flower's waits", reason)
        return False
    loop.time = _Time({IDLE_SLEEP: idle, REPLY_SLEEP: reply})  # type: ignore[assignment]
    log(INFO, "SuperNode polls every %g s when idle and checks replies every %g s", idle, reply)
    return True
