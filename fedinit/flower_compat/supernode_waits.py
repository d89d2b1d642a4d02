"""Adaptive waits inside Flower 1.39's SuperNode loop, applied at their call sites only.

``flwr.supernode.start_client_internal`` sleeps a hard-coded 3 s after an empty pull from
the SuperLink (an idle node notices a new round 1.5 s late on average, 3 s at worst), and
0.5 s between checks for the ClientApp's reply (``_push_messages``) and for that reply's
arrays (``yield_object_contents``, inside it). Flower has no setting for any. We give that
one module a ``time`` whose ``sleep`` looks at its caller: a call from one of those three
lines (``SITES``, found in the module's source by ``call_sites``) with its checked value
gets our wait; every other call, whatever its value, passes through. The arrays wait gets
the reply's wait, as in every measured run. Guard (table entry ``supernode-waits``): both
functions' sources as checked and each site found exactly once; declined, the node keeps
Flower's waits.

The pull interval adapts (``AdaptivePoll``): a reply wait means the node has a message, so
for ``window`` seconds after one the node pulls every ``fast`` seconds (a run is active: the
next round comes soon), afterwards every ``idle`` seconds (a device that waits for work all
day costs little CPU). The first reply wait of each message also calls ``wake``: the warm
executor beside the node waits on a pipe for that instead of polling the Runtime API.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import math
import os
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from logging import INFO, WARNING

from fedinit.flower_compat.guard import allowed

NAME = "supernode-waits"
IDLE_SLEEP = 3
"""Seconds the SuperNode sleeps after a pull that brought no message (flwr 1.39.0)."""
REPLY_SLEEP = 0.5
"""Seconds between its checks for a ClientApp reply, and for the reply's arrays."""


@dataclass(frozen=True)
class Site:
    """One ``time.sleep(seconds)`` call in the function ``function`` (its innermost def)."""

    function: str
    seconds: float
    wait: str
    """Which of ``AdaptivePoll``'s waits replaces it: idle or reply."""


SITES = (Site("start_client_internal", IDLE_SLEEP, "idle"),
         Site("_push_messages", REPLY_SLEEP, "reply"),
         Site("yield_object_contents", REPLY_SLEEP, "reply"))


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


def call_sites(source: str) -> dict[int, Site] | str:
    """{line: site} of each of ``SITES`` in a module's ``source``; a reason when one is not
    there exactly once."""
    found: dict[Site, list[int]] = {s: [] for s in SITES}

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef) else function
            if (isinstance(child, ast.Call) and ast.unparse(child.func) == "time.sleep"
                    and len(child.args) == 1 and isinstance(child.args[0], ast.Constant)):
                for site in SITES:
                    if site.function == function and child.args[0].value == site.seconds:
                        found[site].append(child.lineno)
            visit(child, inner)

    visit(ast.parse(source), "")
    wrong = [s for s, lines in found.items() if len(lines) != 1]
    if wrong:
        return (f"time.sleep({wrong[0].seconds:g}) in {wrong[0].function} found "
                f"{len(found[wrong[0]])} times, not once")
    return {lines[0]: site for site, lines in found.items()}


class _Time(types.ModuleType):
    """The ``time`` module; ``sleep`` called from one of ``sites`` (code of the module whose
    globals are ``module_globals``, at that line, in that function) with its checked value
    waits ``poll``'s time instead."""

    def __init__(self, poll: AdaptivePoll, module_globals: dict[str, object],
                 sites: dict[int, Site]) -> None:
        super().__init__("time")
        self._globals, self._sites = module_globals, sites
        self._waits = {"idle": poll.idle_wait, "reply": poll.reply_wait}

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        caller = sys._getframe(1)
        site = self._sites.get(caller.f_lineno) if caller.f_globals is self._globals else None
        if site is not None and site.function == caller.f_code.co_name \
                and seconds == site.seconds:
            seconds = self._waits[site.wait]()
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


def apply(poll: AdaptivePoll) -> bool:
    """Make the SuperNode's idle and reply waits those of ``poll``, at their call sites."""
    from flwr.supercore import log
    from flwr.supernode import start_client_internal as loop

    if not allowed(NAME):
        return False
    sites = call_sites(inspect.getsource(loop))
    if isinstance(sites, str):
        log(WARNING, "flower_compat: %s not applied (%s); the SuperNode keeps Flower's "
            "waits", NAME, sites)
        return False
    loop.time = _Time(poll, vars(loop), sites)  # type: ignore[assignment]
    log(INFO, "SuperNode pulls every %g s for %g s after a message, else every %g s; checks "
        "replies every %g s", poll.fast, poll.window, poll.idle, poll.reply)
    return True
