"""The simulation's dispatch ask: a node with nothing waiting is answered without Flower's scan,
a node with a message gets exactly what Flower's own method gives, and the guard holds."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from fedinit.flower_compat import fast_dispatch, guard


@pytest.fixture(autouse=True)
def fresh_verdicts() -> Iterator[None]:
    guard.forget()
    yield
    guard.forget()


@dataclass
class Meta:
    dst_node_id: int
    delivered_at: str = ""


@dataclass
class Msg:
    metadata: Meta


@dataclass
class FakeState:
    """The two attributes the fast ask reads, and Flower's ask as a recorder."""

    message_ins_store: dict[str, Msg]
    lock: Any = field(default_factory=threading.RLock)
    asked: list[int] = field(default_factory=list)

    def get_message_ins(self, node_id: int, limit: int | None, *,
                        run_id: int | None = None) -> list[Msg]:
        self.asked.append(node_id)
        found = [m for m in self.message_ins_store.values()
                 if m.metadata.dst_node_id == node_id and not m.metadata.delivered_at][:limit]
        for m in found:
            m.metadata.delivered_at = "now"
        return found


def test_only_nodes_with_an_undelivered_message_reach_flower_s_ask() -> None:
    state = FakeState({"a": Msg(Meta(1)), "b": Msg(Meta(2, delivered_at="t"))})
    fast = fast_dispatch.skipping_empty(state.get_message_ins)
    assert fast(state, 7, 1) == []  # no message for node 7
    assert fast(state, 2, 1) == []  # node 2's message was delivered already
    assert state.asked == []
    got = fast(state, 1, 1)
    assert [m.metadata.dst_node_id for m in got] == [1] and state.asked == [1]
    assert fast(state, 1, 1) == [] and state.asked == [1]  # delivered now


def test_the_installed_flower_is_the_checked_one() -> None:
    """flwr 1.39.0's InMemoryLinkState.get_message_ins still reads as checked; a change in
    Flower turns the patch off (apply returns False) instead of changing behaviour."""
    assert guard.why_not(fast_dispatch.NAME) is None


def test_apply_patches_only_a_real_in_memory_state() -> None:
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    def bare() -> InMemoryLinkState:  # the attributes the ask reads, without a federation
        state = InMemoryLinkState.__new__(InMemoryLinkState)
        state.lock, state.message_ins_store = threading.RLock(), {}
        return state

    assert fast_dispatch.apply(FakeState({})) is False
    state = bare()
    assert fast_dispatch.apply(state) is True
    assert "get_message_ins" in vars(state)
    patched = vars(state)["get_message_ins"]
    assert fast_dispatch.apply(state) is True and vars(state)["get_message_ins"] is patched
    assert state.get_message_ins(node_id=5, limit=1) == []
    assert "get_message_ins" not in vars(bare())  # other states keep Flower's
