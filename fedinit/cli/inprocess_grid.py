"""A Flower ``Grid`` that runs the real ClientApp handlers in this process, node by node.

It lets tests drive the real server loop, strategies and client code without the simulation
engine: each node has its own ``Context`` (node config, persistent state), exactly as Flower
keeps them, and messages are routed by type to ``client_app.app``'s handlers.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from client_app.app import evaluate_fn, query_fn, train_fn

Handler = Callable[[Message, Context], Message]
HANDLERS: dict[str, Handler] = {
    MessageType.TRAIN: train_fn,
    MessageType.QUERY: query_fn,
    MessageType.EVALUATE: evaluate_fn,
}


def set_task_identity() -> None:
    """Messages need a run/node/task identity; Flower sets it inside a real run."""
    TaskIdentity.run_id = 1
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 0


class LocalGrid(Grid):
    """A ``Grid`` whose nodes (``contexts``, by node id) answer in this process, each message
    by ``answer``: a push is answered at once and its replies wait for ``pull_messages``.
    Flower's run-bound calls (the run, a message the grid makes) are never used here, so
    they raise."""

    def __init__(self, contexts: dict[int, Context]) -> None:
        self.contexts = contexts
        self.sent: list[Message] = []
        self._pending: list[Message] = []
        self._pushed = 0

    def answer(self, msg: Message, ctx: Context) -> Message | None:
        """The reply of the node holding ``ctx`` to ``msg``; None: it sends none."""
        raise NotImplementedError

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        out = []
        for msg in messages:
            self.sent.append(msg)
            reply = self.answer(msg, self.contexts[msg.metadata.dst_node_id])
            if reply is not None:
                out.append(reply)
        return out

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Handle the messages at once; their replies wait for ``pull_messages``."""
        msgs = list(messages)
        for msg in msgs:
            self._pushed += 1
            msg.metadata.__dict__["_message_id"] = f"in-process-{self._pushed}"
        self._pending.extend(self.send_and_receive(msgs))
        return [m.metadata.message_id for m in msgs]

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        wanted = set(message_ids)
        out = [r for r in self._pending if r.metadata.reply_to_message_id in wanted]
        self._pending = [r for r in self._pending if r not in out]
        return out

    def set_run(self, run: Any) -> None:  # pragma: no cover - not used
        raise NotImplementedError

    @property
    def run(self) -> Any:  # pragma: no cover - not used
        raise NotImplementedError

    def create_message(self, *args: Any, **kwargs: Any) -> Message:  # pragma: no cover
        raise NotImplementedError


class InProcessGrid(LocalGrid):
    """``num_nodes`` simulated SuperNodes holding partitions 0..num_nodes-1."""

    def __init__(self, num_nodes: int, run_config: dict[str, Any],
                 num_partitions: int | None = None) -> None:
        set_task_identity()
        super().__init__({
            1000 + i: Context(
                run_id=1, node_id=1000 + i,
                node_config={"partition-id": i,
                             "num-partitions": num_partitions or num_nodes},
                state=RecordDict(), run_config=dict(run_config))
            for i in range(num_nodes)
        })
        self.replies: list[Message] = []
        self.reply_filter: Callable[[Message], Message | None] | None = None

    def context_of(self, partition_id: int) -> Context:
        return self.contexts[1000 + partition_id]

    def answer(self, msg: Message, ctx: Context) -> Message | None:
        """``client_app.app``'s handler of the message's type (``reply_filter`` applied)."""
        try:
            reply = HANDLERS[msg.metadata.message_type](msg, ctx)
        except Exception:  # noqa: BLE001 - a client crash becomes an error reply
            reply = Message(Error(code=1, reason=traceback.format_exc()), reply_to=msg)
        if self.reply_filter is not None:
            reply = self.reply_filter(reply)
            if reply is None:
                return None
        self.replies.append(reply)
        return reply
