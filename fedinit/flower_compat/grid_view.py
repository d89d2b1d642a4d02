"""A Flower ``Grid`` that passes every call on to the grid it wraps.

The one base of the project's grid wrappers, which each change one call: the deployment's
faster reply poll (``reply_poll.FastPollGrid``) and the strategies' schedules
(``strategies/schedules.py``: over-selection's first replies, the initial model in train
messages, the client-half check). Not a patch of Flower: it implements Flower's own
``Grid`` interface.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flwr.app import Message
from flwr.serverapp import Grid


class GridView(Grid):
    """``inner``'s every call, passed on as it is; subclasses change one."""

    def __init__(self, inner: Grid) -> None:
        self.inner = inner

    def set_run(self, run_id: Any) -> None:
        self.inner.set_run(run_id)

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
        return self.inner.send_and_receive(messages, timeout=timeout)
