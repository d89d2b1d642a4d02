"""The client store's accounted versions: server-summed keys start from the round the server
aggregated last, the other keys from the newest state, in memory, on disk and both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from flwr.app import RecordDict

from fedinit.store.client_store import W_PREV, ClientStore
from fedinit.store.state_dir import StateDir

C = "c-i"
SHAPES = [np.zeros((2, 3), np.float32), np.zeros(4, np.float32)]


def arrays(value: float) -> list[np.ndarray]:
    return [np.full(a.shape, value, np.float32) for a in SHAPES]


def value(store: ClientStore, key: str) -> float | None:
    got = store.get(key)
    return None if got is None else float(got[0][0, 0])


def participate(store: ClientStore, rnd: int, accounted: int, new_c: float) -> tuple[
        float | None, float | None, bool]:
    """Restore for ``rnd`` as the server says, report (w_prev, c_i) held, train, save."""
    fell_back = store.restore("run", rnd, SHAPES, accounted, (C,))
    seen = value(store, W_PREV), value(store, C)
    store.put(W_PREV, arrays(10 * rnd))
    store.put(C, arrays(new_c))
    store.save("run", rnd)
    return (*seen, fell_back)


def stores(tmp: Path, kind: str) -> tuple[ClientStore, Callable[[], ClientStore]]:
    """A store of ``kind`` and how to get the same client's store at its next message (a
    SuperNode keeps its Context; a simulated client gets a fresh store over the same files)."""
    memory = RecordDict()
    disk = StateDir(tmp, "run", 0) if kind != "memory" else None
    mem = memory if kind != "disk" else None

    def again() -> ClientStore:
        return ClientStore(memory=mem, disk=StateDir(tmp, "run", 0) if disk else None)

    return again(), again


@pytest.mark.parametrize("kind", ["memory", "disk", "both"])
def test_a_lost_reply_does_not_move_the_accounted_state(tmp_path: Path, kind: str) -> None:
    _, again = stores(tmp_path, kind)
    # round 1: first participation, nothing accounted; its reply is aggregated
    assert participate(again(), 1, 0, 1.0) == (None, None, False)
    # round 3: the server aggregated round 1; this reply is LOST
    assert participate(again(), 3, 1, 3.0) == (10.0, 1.0, False)
    # round 5: the server still names round 1: c_i from round 1, w_prev the newest (round 3)
    assert participate(again(), 5, 1, 5.0) == (30.0, 1.0, False)
    # round 7: round 5 was aggregated: both from round 5
    assert participate(again(), 7, 5, 7.0) == (50.0, 5.0, False)


@pytest.mark.parametrize("kind", ["memory", "disk", "both"])
def test_nothing_accounted_yet_means_zeros(tmp_path: Path, kind: str) -> None:
    _, again = stores(tmp_path, kind)
    participate(again(), 2, 0, 2.0)  # lost
    assert participate(again(), 4, 0, 4.0) == (20.0, None, False)  # c_i absent: zeros


def test_messages_without_an_accounted_round_use_the_newest_state(tmp_path: Path) -> None:
    store = ClientStore(memory=RecordDict())
    participate(store, 1, 0, 1.0)
    store.restore("run", 3, SHAPES)  # a server that does not track it (older checkpoint)
    assert value(store, C) == 1.0


def test_disk_keeps_the_accounted_version_beside_the_newest_two(tmp_path: Path) -> None:
    _, again = stores(tmp_path, "disk")
    participate(again(), 1, 0, 1.0)
    for rnd in (3, 5, 7):  # every reply after round 1 lost
        participate(again(), rnd, 1, float(rnd))
    kept = sorted(p.name for p in (tmp_path / "run" / "client-0").glob("*.npz"))
    assert kept == ["r000001.npz", "r000005.npz", "r000007.npz"]
    assert participate(again(), 9, 1, 9.0) == (70.0, 1.0, False)


def test_a_lost_accounted_version_is_a_fallback_to_the_newest(tmp_path: Path) -> None:
    _, again = stores(tmp_path, "disk")
    participate(again(), 1, 0, 1.0)
    participate(again(), 3, 1, 3.0)
    (tmp_path / "run" / "client-0" / "r000001.npz").unlink()
    assert participate(again(), 5, 1, 5.0) == (30.0, 3.0, True)


def test_the_server_counting_a_round_the_client_does_not_hold_is_a_fallback(
        tmp_path: Path) -> None:
    store = ClientStore(memory=RecordDict())
    participate(store, 1, 0, 1.0)
    assert participate(store, 5, 3, 5.0) == (10.0, 1.0, True)


def test_a_round_redone_after_a_server_crash_sees_what_the_first_try_saw(
        tmp_path: Path) -> None:
    """The killed run's round 5 saved its state; the resumed round 5 (same accounted round,
    from the checkpoint) must start from exactly the same w_prev and c_i."""
    _, again = stores(tmp_path, "both")
    participate(again(), 1, 0, 1.0)
    participate(again(), 3, 1, 3.0)  # lost
    first = participate(again(), 5, 1, 5.0)
    restarted = ClientStore(memory=RecordDict(), disk=StateDir(tmp_path, "run", 0))
    assert participate(restarted, 5, 1, 5.0) == first == (30.0, 1.0, False)
