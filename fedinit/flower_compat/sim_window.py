"""A simulation round with at most 32 of its messages stored in Flower's LinkState at once.

Flower's simulation engine scans every stored message for every node on each 0.1 s tick
(``send_windowed`` says what that costs); ``WindowedSimGrid`` is the simulation's own
``InMemoryGrid`` (a copy of that instance: the same LinkState, run and node) whose
``send_and_receive`` pushes a window of messages and one more per reply pulled.

Guard (table entry ``sim-window``): the whole ``InMemoryGrid`` class as checked, since this
copies its instance and overrides one of its methods; declined, ``wrap`` returns the grid it
was given (each round's messages pushed at once, as Flower does).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid
from flwr.superlink.grid import InMemoryGrid

from fedinit.flower_compat.guard import allowed

NAME = "sim-window"
SIM_WINDOW = 32
"""Most messages a simulation round keeps in Flower's LinkState at once (``send_windowed``)."""
SIM_POLL_SECONDS = 0.02


def send_windowed(grid: Grid, messages: Iterable[Message], *, timeout: float | None = None,
                  window: int = SIM_WINDOW, poll: float = SIM_POLL_SECONDS) -> list[Message]:
    """``send_and_receive`` for Flower's simulation engine, with at most ``window`` messages
    pushed and not yet answered at any time; a new one is pushed as each reply is pulled.

    Why: flwr 1.39's engine hands out messages by asking the LinkState, every 0.1 s, for
    each of the N nodes' next message (``vce_api.add_messages_to_queue``), and each ask scans
    every stored message (``InMemoryLinkState.get_message_ins``), so one tick costs about
    3 us x N x messages stored: 0.67 s of CPU at N=1000 with a round's 200 messages pushed at
    once, 3.6 s with 1000, holding the GIL of the process the ServerApp and the engine's
    workers share. With 32 stored it is 0.1 s. Replies are the same messages in another
    arrival order, which the strategy sorts by client before it sums them."""
    pending = list(messages)
    deadline = None if timeout is None else time.monotonic() + timeout
    waiting: set[str] = set()
    replies: list[Message] = []
    while pending or waiting:
        if pending and len(waiting) < window:
            batch, pending = pending[:window - len(waiting)], pending[window - len(waiting):]
            waiting.update(grid.push_messages(batch))
        got = list(grid.pull_messages(waiting)) if waiting else []
        replies.extend(got)
        waiting.difference_update(m.metadata.reply_to_message_id for m in got)
        if deadline is not None and time.monotonic() >= deadline:
            break
        if not got:
            time.sleep(poll if deadline is None
                       else max(0.0, min(poll, deadline - time.monotonic())))
    return replies


class WindowedSimGrid(InMemoryGrid):
    """Flower's simulation grid (same LinkState and run) whose ``send_and_receive`` keeps at
    most ``window`` messages stored (``send_windowed``). Still an ``InMemoryGrid``: the
    server's simulation facts (``engine_facts``) read its LinkState as before."""

    def __init__(self, inner: InMemoryGrid, window: int = SIM_WINDOW,
                 poll: float = SIM_POLL_SECONDS) -> None:
        self.__dict__.update(inner.__dict__)  # the same LinkState, run and node, not new ones
        self.window, self.poll = window, poll

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        return send_windowed(self, messages, timeout=timeout, window=self.window,
                             poll=self.poll)


def wrap(grid: InMemoryGrid) -> Grid:
    """``grid`` as a ``WindowedSimGrid``; ``grid`` itself when the guard declines."""
    return WindowedSimGrid(grid) if allowed(NAME) else grid
