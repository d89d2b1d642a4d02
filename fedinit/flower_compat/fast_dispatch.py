"""The simulation engine's dispatch tick without a full scan for nodes that have no message.

Flower 1.39's simulation hands out messages from a thread that, every 0.1 s, asks the
LinkState for each of the N nodes' next message (``vce_api.add_messages_to_queue``), and each
ask checks every stored message (``InMemoryLinkState.get_message_ins``: expiry and
federation checks through ``_check_stored_messages``, per message, per node). At 1000 nodes
with a round's window of 32 messages stored that is 32,000 checks a tick, about a third of a
core, under the GIL the ServerApp and the engine's workers share. Nearly every ask is for a
node with nothing waiting. ``apply`` gives the run's LinkState (this instance only) a
``get_message_ins`` that first looks, under the state's own lock, for an undelivered message
to that node and answers an empty list at once when there is none; otherwise Flower's own
method runs unchanged. What is skipped for such a node is only the checks of other nodes'
messages, which run again on the next ask for a node that has a message and when replies are
pulled. Guard: ``fedinit.flower_compat.guard`` on ``get_message_ins``'s source (table entry
``fast-dispatch``); declined, Flower's own scan stays.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from logging import INFO
from typing import Any

from fedinit.flower_compat.guard import allowed

NAME = "fast-dispatch"


def skipping_empty(original: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    """``original`` (a bound ``get_message_ins``), answering [] at once for a node with no
    undelivered message."""

    def get_message_ins(self: Any, node_id: int, limit: int | None, *,
                        run_id: int | None = None) -> list[Any]:
        with self.lock:
            waiting = any(m.metadata.dst_node_id == node_id and m.metadata.delivered_at == ""
                          for m in self.message_ins_store.values())
        if not waiting:
            return []
        return original(node_id, limit, run_id=run_id)

    return get_message_ins


def apply(state: Any) -> bool:
    """Give ``state`` (the simulation's InMemoryLinkState) the fast ask; False when not."""
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.supercore import log

    if not isinstance(state, InMemoryLinkState) or not allowed(NAME):
        return False
    if "get_message_ins" not in vars(state):  # not twice (a second run in one process)
        fast = skipping_empty(state.get_message_ins)
        state.get_message_ins = types.MethodType(fast, state)
        log(INFO, "simulation dispatch: nodes with no message waiting are answered at once")
    return True
