"""Adaptive waits inside Flower 1.39's SuperNode loop, applied only where they are known.

``flwr.supernode.start_client_internal`` sleeps a hard-coded 3 s after an empty pull from
the SuperLink (an idle node notices a new round 1.5 s late on average, 3 s at worst) and
0.5 s between checks for the ClientApp's reply. Flower has no setting for either. We give
that one module a ``time`` whose ``sleep`` maps exactly those two waits to ours and passes
every other call through. An upgrade cannot break this silently: it is applied only to the
flwr version whose source was checked, and only when that source still contains both calls
(otherwise the node runs with Flower's own waits and says so); a test checks the source.

The pull interval adapts (``AdaptivePoll``): a reply wait means the node has a message, so
for ``window`` seconds after one the node pulls every ``fast`` seconds (a run is active: the
next round comes soon), afterwards every ``idle`` seconds (a device that waits for work all
day costs little CPU). The first reply wait of each message also calls ``wake``: the warm
executor beside the node waits on a pipe for that instead of polling the Runtime API.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import time
import types
from collections.abc import Callable
from logging import INFO, WARNING

CHECKED_FLWR = "1.39.0"
IDLE_SLEEP = 3
"""Seconds the SuperNode sleeps after a pull that brought no message (flwr 1.39.0)."""
REPLY_SLEEP = 0.5
"""Seconds between its checks for a ClientApp reply (flwr 1.39.0)."""
CALLS = (f"time.sleep({IDLE_SLEEP})", f"time.sleep({REPLY_SLEEP})")


class AdaptivePoll:
    """The SuperNode's waits: ``fast`` pulls for ``window`` s after a message, else ``idle``."""

    def __init__(self, fast: float, idle: float, window: float, reply: float,
                 wake: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fast, self.idle, self.window, self.reply = fast, idle, window, reply
        self.wake = wake
        self.clock = clock
        self.last_message = -math.inf
        """When the node last waited for a reply (its last message), by ``clock``."""
        self._waiting = False

    def idle_wait(self) -> float:
        """Seconds to sleep after an empty pull."""
        self._waiting = False
        active = self.clock() - self.last_message < self.window
        return self.fast if active else self.idle

    def reply_wait(self) -> float:
        """Seconds to sleep before the next check for a reply; the first check of a message
        marks the node active and wakes the executor."""
        self.last_message = self.clock()
        if not self._waiting:
            self._waiting = True
            if self.wake is not None:
                self.wake()
        return self.reply


class _Time(types.ModuleType):
    """The ``time`` module with Flower's two hard-coded sleeps replaced by ``poll``'s."""

    def __init__(self, poll: AdaptivePoll) -> None:
        super().__init__("time")
        self._poll = poll

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        if seconds == IDLE_SLEEP:
            seconds = self._poll.idle_wait()
        elif seconds == REPLY_SLEEP:
            seconds = self._poll.reply_wait()
        time.sleep(seconds)


class PipeWaker:
    """A pipe: the executor waits on ``read_fd``; calling this writes one byte, never blocking
    (a full pipe means the executor is woken already)."""

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)

    def __call__(self) -> None:
        with contextlib.suppress(BlockingIOError, BrokenPipeError):
            os.write(self.write_fd, b"w")

    def close(self) -> None:
        os.close(self.write_fd)


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


def install(poll: AdaptivePoll) -> bool:
    """Make the SuperNode's idle and reply waits those of ``poll``."""
    from flwr.supercore import log
    from flwr.supernode import start_client_internal as loop

    reason = why_not_patchable()
    if reason is not None:
        log(WARNING, "fast poll not applied (%s); the SuperNode keeps Flower's waits", reason)
        return False
    loop.time = _Time(poll)  # type: ignore[assignment]
    log(INFO, "SuperNode pulls every %g s for %g s after a message, else every %g s; checks "
        "replies every %g s", poll.fast, poll.window, poll.idle, poll.reply)
    return True
