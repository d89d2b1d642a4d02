"""fedinit.flower_compat.reply_order, replayed on Flower 1.39's own SuperNode loop functions.

The scene of tests/test_superlink_crash.py's one failure, step by step: the SuperLink is
killed while a node receives a train message and comes back with that run stopped, so
Flower's ``_pull_and_store_message`` gets ``RunNotRunningException`` from
``confirm_message_received``, logs "Ignoring message" and leaves the message stored; the
executor still runs it and stores its reply. The resumed run's identity query comes next.
Flower's ``_push_messages`` sends the stale reply and returns: the query is never answered
(the node would answer it only after its next message, which the server sends only once it
has answered). With the patch's wrappers both replies are sent, the query's last.

The wrappers are applied to local references only: no process-wide patch in a test.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run, RunNotRunningException
from flwr.supercore.task_identity import TaskIdentity
from flwr.supernode import start_client_internal as loop
from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

from fedinit.flower_compat import reply_order

KILLED_RUN, RESUMED_RUN, NODE = 11, 22, 5


@pytest.fixture(autouse=True)
def task_identity() -> Iterator[None]:
    """Flower stamps a new Message with the task's identity (the link's, here)."""
    saved = TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = KILLED_RUN, 1, 0
    yield
    TaskIdentity._run_id, TaskIdentity._task_id, TaskIdentity._node_id = saved


def instruction(run_id: int, kind: str) -> Message:
    """A message as the SuperLink hands it out (its id is its object id)."""
    msg = Message(RecordDict({"config": ConfigRecord({"kind": kind})}), dst_node_id=NODE,
                  message_type=kind)
    msg.metadata.__dict__["_run_id"] = run_id
    msg.metadata.__dict__["_message_id"] = msg.object_id
    return msg


class Link:
    """The SuperLink's side of the node's calls: the killed run is stopped."""

    def __init__(self) -> None:
        self.queue: list[Message] = []
        self.objects: dict[str, bytes] = {}
        self.sent: list[str] = []
        """The ids of the messages whose reply reached the link (refused ones too)."""

    def hand_out(self, msg: Message) -> None:
        self.queue.append(msg)
        self.objects.update({k: v.deflate() for k, v in get_all_nested_objects(msg).items()})

    def calls(self) -> dict[str, Callable[..., Any]]:
        def receive() -> Any:
            if not self.queue:
                return None
            msg = self.queue.pop(0)
            return msg, loop.get_object_tree(msg)

        def confirm(run_id: int, _msg_id: str) -> None:
            if run_id == KILLED_RUN:
                raise RunNotRunningException  # what the restarted link answers

        def never(*_: Any) -> Any:
            raise AssertionError("the run is known to the node: not asked")

        return {"receive": receive, "get_run": never, "get_fab": never,
                "pull_object": lambda _run, obj: self.objects[obj],
                "confirm_message_received": confirm}

    def send(self, message: Message, _tree: Any, _runtime: float) -> tuple[set[str], str]:
        self.sent.append(message.metadata.reply_to_message_id)
        if message.metadata.run_id == KILLED_RUN:
            raise RunNotRunningException
        return set(), "session"


def reply_later(state: InMemoryNodeState, store: Any, to: Message, seconds: float) -> None:
    """The executor's reply to ``to``, stored after ``seconds`` (as a worker pushes it)."""
    def store_reply() -> None:
        loop._insert_message(Message(RecordDict({"config": ConfigRecord({"ok": 1})}),
                                     reply_to=to), state, store)

    threading.Timer(seconds, store_reply).start()


@pytest.mark.parametrize("patched", [False, True], ids=["flower", "reply-order"])
def test_a_stale_reply_no_longer_takes_the_current_messages_place(patched: bool) -> None:
    store = ObjectStoreFactory().store()
    state = InMemoryNodeState(store)
    state.set_node_id(NODE)
    for run in (KILLED_RUN, RESUMED_RUN):
        state.store_run(Run.create_empty(run))
    link = Link()
    pull, push = loop._pull_and_store_message, loop._push_messages
    if patched:
        current: dict[str, str | None] = {"id": None}
        pull, push = reply_order.noting(pull, current), reply_order.answering(push, current)
    kw = {"state": state, "object_store": store, "node_config": {}, "trusted_entities": None}

    # 1. The killed run's train message: received, then the link says the run is stopped.
    stale = instruction(KILLED_RUN, "train")
    link.hand_out(stale)
    assert pull(**kw, **link.calls()) is None  # Flower: "Ignoring message"
    assert reply_order.unanswered(state, stale.metadata.message_id)  # yet left stored
    loop._insert_message(Message(RecordDict(), reply_to=stale), state, store)  # its task ran

    # 2. The resumed run's identity query; its reply comes 0.2 s after the node waits.
    query = instruction(RESUMED_RUN, "query")
    link.hand_out(query)
    assert pull(**kw, **link.calls()) == RESUMED_RUN
    reply_later(state, store, query, 0.2)
    push(state=state, object_store=store, send=link.send, push_object=lambda *_: None)

    ids = {stale.metadata.message_id: "stale", query.metadata.message_id: "query"}
    if patched:
        assert [ids[m] for m in link.sent] == ["stale", "query"]
        assert not reply_order.unanswered(state, query.metadata.message_id)
    else:  # Flower's loop: the stale reply took the query's place, the query is unanswered
        assert [ids[m] for m in link.sent] == ["stale"]
        assert reply_order.unanswered(state, query.metadata.message_id)


def test_without_a_stale_reply_flowers_push_runs_once() -> None:
    calls: list[str] = []
    current: dict[str, str | None] = {"id": "m1"}
    state = InMemoryNodeState(ObjectStoreFactory().store())

    def push(**_: Any) -> None:
        calls.append("push")  # m1 is not in the state: it was answered

    reply_order.answering(push, current)(state=state)
    assert calls == ["push"]


def test_the_noted_message_is_reset_when_nothing_was_stored() -> None:
    current: dict[str, str | None] = {"id": "earlier"}

    def pull(**kw: Any) -> int | None:
        kw["receive"]()
        return None

    got = instruction(RESUMED_RUN, "train")
    assert reply_order.noting(pull, current)(receive=lambda: (got, None)) is None
    assert current["id"] is None
