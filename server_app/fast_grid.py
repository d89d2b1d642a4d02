"""The round's replies collected as they arrive, not in Flower's 3 s steps.

Flower 1.39's deployment grid (``HttpGrid.send_and_receive``) pushes the messages, then pulls
replies and sleeps 3 s between pulls: a round that is done after 1.1 s is noticed after 3 s.
``FastPollGrid`` wraps whatever grid the ServerApp received and does the same push and pull
with a short pause (``POLL_SECONDS``), until every message is answered or the timeout
passes. Replies, their order of arrival and the fault handling downstream are unchanged:
only the waiting is shorter. The simulation's grid already pulls every 0.1 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid
from flwr.superlink.grid import InMemoryGrid

POLL_SECONDS = 0.1


class FastPollGrid(Grid):
    """Delegates to ``inner``; ``send_and_receive`` pulls every ``poll`` seconds."""

    def __init__(self, inner: Grid, poll: float = POLL_SECONDS) -> None:
        self.inner = inner
        self.poll = poll

    def set_run(self, run: Any) -> None:
        self.inner.set_run(run)

    @property
    def run(self) -> Any:
        return self.inner.run

    def create_message(self, *args: Any, **kwargs: Any) -> Message:
        return self.inner.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.inner.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.inner.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Push, then pull until all are answered or ``timeout`` seconds have passed."""
        waiting = set(self.inner.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while waiting:
            got = list(self.inner.pull_messages(waiting))
            replies.extend(got)
            waiting.difference_update(m.metadata.reply_to_message_id for m in got)
            if not waiting or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(self.poll if deadline is None
                       else max(0.0, min(self.poll, deadline - time.monotonic())))
        return replies


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
