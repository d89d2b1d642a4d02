"""The round's replies collected as they arrive, not in Flower's 3 s steps.

Flower 1.39's deployment grid (``HttpGrid.send_and_receive``) pushes the messages, then pulls
replies and sleeps 3 s between pulls: a round that is done after 1.1 s is noticed after 3 s.
``FastPollGrid`` wraps whatever grid the ServerApp received and does the same push and pull
with a short pause (``POLL_SECONDS``), until every message is answered or the timeout
passes. Replies, their order of arrival and the fault handling downstream are unchanged:
only the waiting is shorter. The simulation's grid already pulls every 0.1 s.

Guard (table entry ``reply-poll``): ``HttpGrid.send_and_receive`` (what this replaces) and
Flower's ``Grid`` (the interface this implements) as checked; declined, ``wrap`` returns the
grid it was given.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from fedinit.flower_compat.grid_view import GridView
from fedinit.flower_compat.guard import allowed
from fedinit.flower_compat.object_pulls import pulls_until

NAME = "reply-poll"
POLL_SECONDS = 0.1
LAST_PULL_SECONDS = 2.0
"""How long the one last pull after the deadline may wait for arrays (see send_and_receive)."""


class FastPollGrid(GridView):
    """Delegates to ``inner``; ``send_and_receive`` pulls every ``poll`` seconds."""

    def __init__(self, inner: Grid, poll: float = POLL_SECONDS) -> None:
        super().__init__(inner)
        self.poll = poll

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        """Push, then pull until all are answered or ``timeout`` seconds have passed."""
        waiting = set(self.inner.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while waiting:
            started = time.monotonic()
            with pulls_until(deadline):  # a reply whose arrays never come: not for 2 hours
                got = list(self.inner.pull_messages(waiting))
            replies.extend(got)
            waiting.difference_update(m.metadata.reply_to_message_id for m in got)
            if not waiting:
                break
            if deadline is not None and time.monotonic() >= deadline:
                if started < deadline:  # one reply's missing arrays held the pull to the
                    # deadline: replies that came whole meanwhile were never pulled and
                    # would count as missing (a reset cut one node's push, and another
                    # node's reply, there 15 s before the deadline, was lost: issue 44)
                    with pulls_until(time.monotonic() + LAST_PULL_SECONDS):
                        replies.extend(self.inner.pull_messages(waiting))
                break
            time.sleep(self.poll if deadline is None
                       else max(0.0, min(self.poll, deadline - time.monotonic())))
        return replies


def wrap(grid: Grid) -> Grid:
    """``grid`` with its replies pulled every ``POLL_SECONDS``; ``grid`` itself when the
    guard declines."""
    return FastPollGrid(grid) if allowed(NAME) else grid
