"""Over-selection for synchronous rounds (Bonawitz et al. 2019, "Towards federated learning
at scale"): ``over-select`` o > 0 samples ceil(m (1 + o)) clients and closes the round at the
first m replies that pass the decode checks (``DecodeReplies``), in arrival order; with
``device-speeds`` on, in simulated order instead (``strategies.virtual_clock``).

The train messages are pushed at once (``Grid.push_messages``) and their replies pulled by
message id (``Grid.pull_messages``) until m are accepted or ``round-timeout`` passes. Replies
pulled after the m-th accepted one are dropped and logged; those still out are never pulled:
a later round pulls only its own message ids, so a late reply can never be aggregated in it.

"Telling the others to stop": Flower 1.39 has no way to cancel a message once pushed, so
nothing is cancelled: a late client trains to the end and its reply is ignored (it expires on
the SuperLink at its TTL; ``task-deadline`` still bounds a hung task on a node). A late
client's reply is handled as a lost one: its accounted round does not advance, so a stateful
client next starts from the state version the server counted (docs/algorithms.md, accounted
rounds).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from logging import INFO

from flwr.app import Message
from flwr.common.logger import log
from flwr.serverapp import Grid

POLL_SECONDS = 0.05
"""Pause between pulls that brought nothing."""
OVER_SELECT_FIELDS = ("over-selected", "accepted-at-close", "dropped-late")
"""Columns an over-selected run adds to each rounds.jsonl row: clients messaged (ceil(m(1+o))
when all are connected), replies accepted by the decode checks when the round closed (m,
or fewer at the timeout) and train messages whose reply the round did not wait for."""


@dataclasses.dataclass(frozen=True)
class Collected:
    """A round's replies up to its close, in arrival order, and what it did not wait for."""

    replies: list[Message]
    accepted: int
    late: int

    def fields(self, messaged: int) -> dict[str, int]:
        """The round's ``OVER_SELECT_FIELDS``."""
        return {"over-selected": messaged, "accepted-at-close": self.accepted,
                "dropped-late": self.late}


def collect_first(grid: Grid, messages: Sequence[Message], need: int,
                  accepts: Callable[[Message], bool], timeout: float, server_round: int,
                  poll: float = POLL_SECONDS) -> Collected:
    """Push ``messages``, pull their replies until ``need`` are accepted (``accepts``) or
    ``timeout`` seconds pass; a reply pulled after that is dropped (logged), one not pulled is
    never asked for again."""
    ids = list(grid.push_messages(messages))
    out: list[Message] = []
    outstanding = set(ids)
    accepted = dropped = 0
    deadline = time.monotonic() + timeout
    while outstanding and accepted < need and time.monotonic() < deadline:
        got = list(grid.pull_messages(sorted(outstanding)))
        if not got:
            time.sleep(poll)
            continue
        for msg in got:
            reply_to = msg.metadata.reply_to_message_id
            if reply_to not in outstanding:
                continue  # not one of this round's (or a duplicate): never aggregated
            outstanding.discard(reply_to)
            if accepted >= need:
                dropped += 1
                log(INFO, "round %d: dropped the late reply of node %s (the round closed at "
                    "%d accepted replies)", server_round, msg.metadata.src_node_id, need)
                continue
            out.append(msg)
            accepted += accepts(msg)
    if accepted < need:  # the timeout: what is still out is missing, as without over-select
        return Collected(out, accepted, dropped)
    if outstanding:
        log(INFO, "round %d: closed at %d accepted replies; %d over-selected clients still "
            "training are not waited for (their replies will be ignored)", server_round, need,
            len(outstanding))
    return Collected(out, accepted, dropped + len(outstanding))
