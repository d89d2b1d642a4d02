"""The simulated client's per-participation savings (issue 23): state files written without
their own fsync and made durable by the server once per round, the run config parsed once
per process, client tensors cached by bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

import fedinit.store.files as files
import server_app.experiment as experiment
from client_app import app as client_app
from client_app import state_place
from client_app.model_cache import _TensorCache
from fedinit.config import RunConfig
from fedinit.flower_compat.sim_window import WindowedSimGrid
from fedinit.store.client_store import W_PREV, ClientStore
from fedinit.store.path_names import PathError
from fedinit.store.state_dir import StateDir
from server_app.engine_facts import in_simulation
from server_app.experiment import run_experiment
from tests.sim_engine import InProcessSimulation

pytestmark = pytest.mark.usefixtures("quick_runs")

SMALL = {"num-clients": 4, "fraction-train": 1.0, "num-server-rounds": 2, "train-limit": 400,
         "local-epochs": 1, "method": "scaffold", "beta": 0.1, "eval-every": 2}


def test_unsynced_write_skips_fsync_and_sync_filesystem_flushes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(files.os, "fsync", lambda fd: calls.append(fd))
    files.atomic_write_bytes(tmp_path / "a", b"x")
    assert len(calls) == 1
    files.write_record(tmp_path / "b.npz", {"g": [np.ones(2)]}, {"k": 1}, sync=False)
    assert len(calls) == 1  # no fsync of its own
    groups, meta = files.read_record(tmp_path / "b.npz")
    assert meta == {"k": 1} and groups["g"][0].tolist() == [1.0, 1.0]
    files.sync_filesystem(tmp_path)  # one flush of the file system; no error
    files.sync_filesystem(tmp_path / "missing")  # nothing there: nothing to do


def test_simulated_client_writes_unsynced_and_server_syncs_each_round(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "num-partitions": 4},
                  state=RecordDict(), run_config={})
    cfg = RunConfig.parse(SMALL)
    with pytest.raises(PathError, match="client-state-root="):  # not hosted: a device refuses
        client_app.client_store(ctx, cfg, "exp", 0, str(tmp_path))
    with monkeypatch.context() as hosted:  # as Flower's simulation engine calls it
        hosted.setattr(state_place, "server_hosted", lambda: True)
        assert client_app.client_store(ctx, cfg, "exp", 0, str(tmp_path)).disk.sync is False
    assert client_app.client_store(ctx, cfg, "exp", 0, "").disk is None  # deployment: memory
    synced: list[Path] = []
    monkeypatch.setattr(experiment, "sync_filesystem", synced.append)
    overrides: dict[str, Any] = {**SMALL, "output-dir": str(tmp_path / "out")}
    with InProcessSimulation(4, overrides) as sim:
        run_experiment(sim.grid, RunConfig.parse(overrides), out_dir=tmp_path / "run")
    root = (tmp_path / "run" / "client-state").resolve()
    assert synced == [root, root]  # once per round, on the clients' state directory
    assert len(list(root.rglob("*.npz"))) == 8


def test_disk_only_store_keeps_arrays_unencoded_and_copies(tmp_path: Path) -> None:
    store = ClientStore(None, StateDir(tmp_path, "run", 0, sync=False))
    w = [np.arange(3, dtype=np.float32)]
    store.put(W_PREV, w)
    w[0][0] = 7.0  # the caller's array changes; the stored one does not
    got = store.get(W_PREV)
    assert got is not None and got[0].tolist() == [0.0, 1.0, 2.0]
    got[0][1] = 9.0
    assert store.get(W_PREV)[0].tolist() == [0.0, 1.0, 2.0]  # type: ignore[index]
    store.save("run", 1)
    later = ClientStore(None, StateDir(tmp_path, "run", 0))
    assert later.restore("run", 2, w) is False
    assert later.get(W_PREV)[0].tolist() == [0.0, 1.0, 2.0]  # type: ignore[index]
    assert later.tag() == ("run", 1)


def test_run_config_parsed_once_per_distinct_mapping() -> None:
    def ctx(raw: dict[str, Any]) -> Context:
        return Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                       run_config=dict(raw))

    first = client_app.run_config_of(ctx({"num-clients": 7}))
    assert client_app.run_config_of(ctx({"num-clients": 7})) is first
    other = client_app.run_config_of(ctx({"num-clients": 8}))
    assert other is not first and other.num_clients == 8


def test_tensor_cache_is_bounded_by_bytes() -> None:
    made: list[int] = []

    def make(i: int) -> Any:
        made.append(i)
        return torch.zeros(100, dtype=torch.float32), torch.zeros(0, dtype=torch.int64)

    cache = _TensorCache(max_bytes=1000)  # two entries of 400 bytes fit, three do not
    a = cache.get((1,), lambda: make(1))
    assert cache.get((1,), lambda: make(1)) is a and made == [1]
    cache.get((2,), lambda: make(2))
    cache.get((1,), lambda: make(1))  # 1 is now the most recent
    cache.get((3,), lambda: make(3))  # evicts 2, the least recent
    assert cache.bytes == 800 and list(cache.held) == [(1,), (3,)]
    cache.get((2,), lambda: make(2))
    assert made == [1, 2, 3, 2]


def test_simulation_rounds_keep_at_most_a_window_of_messages_in_flight(tmp_path: Path) -> None:
    """Flower's engine scans every stored message for each node every 0.1 s; the ServerApp's
    simulation grid keeps at most a window of a round's messages stored, and the run ends
    on the same model as with every message pushed at once (Flower's own grid)."""
    overrides: dict[str, Any] = {**SMALL, "num-clients": 8, "train-limit": 800,
                                 "output-dir": str(tmp_path / "out")}
    finals = []
    for name, window in (("windowed", 3), ("flower", 0)):
        stored: list[int] = []
        with InProcessSimulation(8, overrides) as sim:
            grid = WindowedSimGrid(sim.grid, window=3) if window else sim.grid
            state = sim.factory.state()
            push = grid.push_messages

            def counting(msgs: Any, push: Any = push, state: Any = state,
                         stored: list[int] = stored) -> Any:
                ids = push(msgs)
                stored.append(len(state.message_ins_store))
                return ids

            grid.push_messages = counting  # type: ignore[method-assign]
            assert in_simulation(grid)
            run_experiment(grid, RunConfig.parse(overrides), out_dir=tmp_path / name)
        finals.append(np.load(tmp_path / name / "final_model.npz"))
        if window:
            assert max(stored) <= 3 and len(stored) > 6  # 2 rounds x 8 messages, 3 at a time
        else:
            assert max(stored) >= 8  # a round's 8 messages at once
    assert all(finals[0][k].tobytes() == finals[1][k].tobytes() for k in finals[0].files)
