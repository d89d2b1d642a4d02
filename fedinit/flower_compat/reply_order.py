"""The SuperNode sends the reply to the message it just received, not only whichever reply
is in its state first.

Flower 1.39's SuperNode loop handles one message at a time: ``_pull_and_store_message``
stores it, then ``_push_messages`` waits until *any* reply is in the node's state, sends every
reply there and returns; the loop then pulls the next message. A reply to an *earlier*
message can be there already: a message of a run that stopped while the node was receiving
it (a SuperLink killed and restarted: ``confirm_message_received`` raises
``RunNotRunningException``, which Flower's loop logs as "Ignoring message" but leaves the
message stored and its task open, so the executor still runs it and stores its reply later),
or an error reply Flower stores when a task's token expires. ``_push_messages`` then sends that
stale reply, returns, and the current message's reply stays in the node's state until the
node receives another message: the node answers every later message one message late. Seen
as a node that never answers its identity query after a SuperLink restart (the server sends it
nothing else until it answers) in ``tests/test_superlink_crash.py``.

We give the module a ``_pull_and_store_message`` that notes the id of the message it
received, and a ``_push_messages`` that calls Flower's again (sending whatever replies are
there each time) until that message is answered: a stale reply is still sent (its run is
stopped: the SuperLink refuses it, Flower logs it and drops it), and the loop moves on only
once the current message is answered. Nothing else changes: a node with no stale reply calls
Flower's ``_push_messages`` exactly once.

Guard (table entry ``reply-order``): ``start_client_internal`` (calls both by their module
globals, with keywords), ``_push_messages`` (deletes the message a reply answers, and only
then), ``_pull_and_store_message`` (takes ``receive`` as a keyword and returns a run id only
when it stored the message or an error reply to it) and ``InMemoryNodeState.store_message`` /
``delete_messages`` (messages live in ``msg_store`` by id), as checked. Declined: Flower's
loop, one message late after a stale reply.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from logging import INFO
from typing import Any

from fedinit.flower_compat.guard import allowed

NAME = "reply-order"
MODULE = "flwr.supernode.start_client_internal"


def unanswered(state: Any, message_id: str) -> bool:
    """Whether ``message_id`` is still in the node's state (Flower deletes it with its
    reply once the reply is sent); a state we cannot read counts as answered."""
    store = getattr(state, "msg_store", None)
    lock = getattr(state, "lock_msg_store", None)
    if store is None or lock is None:
        return False
    with lock:
        return message_id in store


def apply() -> bool:
    """Make the SuperNode wait for the reply to the message it received; True when
    installed (also when installed before in this process)."""
    from flwr.supercore import log

    module = importlib.import_module(MODULE)
    if getattr(module._push_messages, "reply_order", False):
        return True
    if not allowed(NAME):
        return False
    current: dict[str, str | None] = {"id": None}
    module._pull_and_store_message = noting(module._pull_and_store_message, current)
    module._push_messages = answering(module._push_messages, current)
    log(INFO, "SuperNode: each message waits for its own reply (a stale reply is sent "
        "first, never in its place)")
    return True


def noting(original: Callable[..., int | None],
           current: dict[str, str | None]) -> Callable[..., int | None]:
    """``original`` (Flower's ``_pull_and_store_message``), noting in ``current`` the id of
    the message it stored (None when it stored none)."""

    @functools.wraps(original)
    def pull_and_store(**kw: Any) -> int | None:
        current["id"] = None  # also when a wrapper around us raises past this call
        received: list[str] = []
        receive = kw["receive"]

        def receive_noted() -> Any:
            got = receive()
            if got is not None:
                received.append(got[0].metadata.message_id)
            return got

        run_id = original(**{**kw, "receive": receive_noted})
        current["id"] = received[-1] if run_id is not None and received else None
        return run_id

    return pull_and_store


def answering(original: Callable[..., None],
              current: dict[str, str | None]) -> Callable[..., None]:
    """``original`` (Flower's ``_push_messages``), called again until the message in
    ``current`` is answered."""
    from flwr.supercore import log

    @functools.wraps(original)
    def push_messages(**kw: Any) -> None:
        want = current["id"]
        original(**kw)
        while want is not None and unanswered(kw["state"], want):
            log(INFO, "a reply to an earlier message was sent; still waiting for the reply "
                "to message %s", want)
            original(**kw)

    push_messages.reply_order = True  # type: ignore[attr-defined]
    return push_messages
