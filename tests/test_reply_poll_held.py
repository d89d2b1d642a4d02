"""A round's pull of replies held to the deadline by one reply whose arrays never come (a
connection reset cut its push) must still take the replies that came whole meanwhile: seen
on a flaky-wifi link (tests/test_link_scenarios.py), where the other node's reply, on the
SuperLink 15 s before the deadline, was counted missing."""

from __future__ import annotations

import time
from collections.abc import Iterable

from flwr.app import Message, RecordDict

from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.flower_compat.object_pulls import _DEADLINE
from fedinit.flower_compat.reply_poll import LAST_PULL_SECONDS, FastPollGrid


class HeldPullGrid:
    """m0's reply is registered with an array missing: a pull that includes it waits for the
    array until the pull deadline, then hands m0 back (as Flower's error reply would be).
    m1's reply arrives whole at 0.1 s."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.messages: list[Message] = []
        self.pulls: list[list[str]] = []

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        self.t0 = time.monotonic()
        self.messages = list(messages)
        return ["m0", "m1"]

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        ids = sorted(message_ids)
        self.pulls.append(ids)
        ready = ["m1"] if time.monotonic() - self.t0 >= 0.1 else []
        if "m0" in ids:
            deadline = _DEADLINE.get()
            assert deadline is not None
            time.sleep(max(0.0, deadline - time.monotonic()))
            ready.append("m0")
        out = []
        for mid in ready:
            if mid in ids:
                reply = Message(RecordDict(), reply_to=self.messages[int(mid[1])])
                reply.metadata.__dict__["_reply_to_message_id"] = mid
                out.append(reply)
        return out


def test_a_reply_that_came_while_another_held_the_pull_is_not_lost() -> None:
    set_task_identity()
    sent = [Message(RecordDict(), dst_node_id=i + 1, message_type="train") for i in range(2)]
    inner = HeldPullGrid()
    t0 = time.monotonic()
    replies = list(FastPollGrid(inner, poll=0.05).send_and_receive(  # type: ignore[arg-type]
        sent, timeout=0.5))
    wall = time.monotonic() - t0
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1"]
    assert inner.pulls == [["m0", "m1"], ["m1"]]  # one last pull, of the rest only
    assert wall < 0.5 + LAST_PULL_SECONDS
