"""A federation that changes under the run: sampling among the connected clients, min-clients,
late joiners, and identity answers that are wrong, fail or never come (in-process grid, the
real server loop and ClientApp; the process deployment is tests/test_deploy_faults.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from client_app.app import partition_of
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import ConfigError, RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.sampling import sample_available, sample_clients
from server_app import clients
from server_app.clients import FederationError, Fleet
from server_app.experiment import run_experiment

pytestmark = pytest.mark.usefixtures("quick_runs", "fake_clock")

SMALL = {"num-clients": 3, "fraction-train": 1.0, "num-server-rounds": 3, "train-limit": 300,
         "local-epochs": 1, "batch-size": 50, "node-wait-timeout": 3.0}


# ------------------------------------------------------------------ sampler
@pytest.mark.parametrize("n, k", [(3, 1), (10, 3), (20, 20), (100, 10)])
def test_sampler_equals_todays_when_every_client_is_available(n: int, k: int) -> None:
    for seed in range(3):
        for rnd in range(1, 30):
            assert sample_available(seed, rnd, n, k, range(n)) == sample_clients(seed, rnd, n, k)


def test_sampler_keeps_the_available_chosen_and_fills_up_from_the_available_only() -> None:
    n, k = 20, 6
    changed = 0
    for rnd in range(1, 60):
        available = set(np.random.default_rng(rnd).choice(n, size=9, replace=False).tolist())
        got = sample_available(7, rnd, n, k, available)
        assert got == sample_available(7, rnd, n, k, sorted(available))  # deterministic
        assert got == sorted(set(got)) and len(got) == k
        assert set(got) <= available
        today = set(sample_clients(7, rnd, n, k))
        assert today & available <= set(got)  # the chosen that are there stay
        changed += got != sorted(today)
    assert changed > 0


def test_sampler_takes_all_available_when_fewer_than_per_round() -> None:
    assert sample_available(0, 1, 10, 5, [2, 7]) == [2, 7]
    assert sample_available(0, 1, 10, 5, []) == []


# ------------------------------------------------------------------ config
def test_min_clients_is_range_checked() -> None:
    assert RunConfig.parse({"num-clients": 3}).fleet.min_clients == 0
    with pytest.raises(ConfigError, match="min-clients=4 is not allowed"):
        RunConfig.parse({"num-clients": 3, "min-clients": 4})


# ------------------------------------------------------------------ identity
@pytest.fixture
def flwr_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    logging.getLogger("flwr").propagate = True
    caplog.set_level(logging.INFO, logger="flwr")
    return caplog


def add_node(grid: InProcessGrid, node: int, node_config: dict[str, Any]) -> None:
    grid.contexts[node] = Context(run_id=1, node_id=node, node_config=node_config,
                                  state=RecordDict(), run_config=dict(grid.run_config))


class ChangingGrid(InProcessGrid):
    """Node 1002 (partition 2) and three misbehaving nodes join after round 1's training:
    5555 knows another federation size, 6666's query handler raises, 7777 never answers."""

    def __init__(self, run_config: dict[str, Any]) -> None:
        super().__init__(3, run_config)
        self.run_config = run_config
        self.late = self.contexts.pop(1002)

    def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
        msgs = list(messages)
        out = super().send_and_receive(msgs, timeout=timeout)
        if msgs and msgs[0].metadata.message_type == MessageType.TRAIN \
                and 1002 not in self.contexts:
            self.contexts[1002] = self.late
            add_node(self, 5555, {"partition-id": 1, "num-partitions": 7})
            add_node(self, 6666, {"partition-id": "not a number"})
            add_node(self, 7777, {"partition-id": 0, "num-partitions": 3})
        return out


def silent_7777(reply: Message) -> Message | None:
    silent = reply.metadata.src_node_id == 7777
    return None if silent and reply.metadata.message_type == MessageType.QUERY else reply


def queries_to(grid: InProcessGrid, node: int) -> int:
    return sum(m.metadata.message_type == MessageType.QUERY and m.metadata.dst_node_id == node
               for m in grid.sent)


def test_late_and_misbehaving_nodes_never_stop_the_run(
        tmp_path: Path, flwr_log: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "RETRY_SECONDS", 0.0)  # ask the failing node every round
    monkeypatch.setattr(clients, "IDENTITY_WAIT_SECONDS", 0.0)  # say the silent one at once
    raw = {**SMALL, "num-server-rounds": 4, "min-clients": 2, "output-dir": str(tmp_path)}
    grid = ChangingGrid(raw)
    grid.reply_filter = silent_7777
    run_experiment(grid, RunConfig.parse(raw), out_dir=tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    # Round 1 ran on the two clients there; client 2, asked beside round 2, trains from round 3.
    assert [r["clients-trained"] for r in rows] == [[0, 1], [0, 1], [0, 1, 2], [0, 1, 2]]
    assert [r["num-replies"] for r in rows] == [2, 2, 3, 3]
    log = flwr_log.text
    assert log.count("refused node 5555: it has num-partitions=7 but num-clients=3") == 1
    assert queries_to(grid, 5555) == 1  # refused for good
    assert log.count("refused node 6666: the identity query failed") == 1
    assert queries_to(grid, 6666) >= 2  # an error reply: asked again, logged once
    assert queries_to(grid, 7777) == 1  # no answer yet: pending, not asked again
    assert "refused node 7777" not in log
    assert log.count("node 7777 is connected but has not answered its identity query") == 1
    assert "node 1002 is connected but has not answered" not in log  # it answered


def test_a_start_that_gives_up_names_min_clients_and_the_silent_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = {**SMALL, "node-wait-timeout": 1.0, "output-dir": str(tmp_path)}
    grid = InProcessGrid(3, raw)
    grid.reply_filter = lambda r: None if r.metadata.src_node_id == 1002 else r
    with pytest.raises(FederationError) as err:
        run_experiment(grid, RunConfig.parse(raw), out_dir=tmp_path / "run")
    message = str(err.value)
    assert "only 2 of num-clients=3 SuperNodes connected and identified" in message
    assert "or set min-clients=2 to start with the clients identified" in message
    assert message.endswith("(no identity answer yet from node 1002)")


def test_a_node_with_its_own_data_is_the_client_its_registry_entry_names(
        tmp_path: Path) -> None:
    """Node 1001 has no partition-id: the registry makes it client 1, the messages say so,
    and the run is bit-identical to one where it knows its partition."""
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps({"1000": 0, "1001": 1, "1002": 2}))
    finals = []
    for name, device in (("plain", False), ("device", True)):
        raw = {**SMALL, "output-dir": str(tmp_path), "node-registry": str(registry)}
        grid = InProcessGrid(3, raw)
        if device:
            grid.contexts[1001].node_config.clear()
        run_experiment(grid, RunConfig.parse(raw), out_dir=tmp_path / name)
        with np.load(tmp_path / name / "final_model.npz") as z:
            finals.append([z[k] for k in sorted(z.files)])
        sent = [m for m in grid.sent if m.metadata.dst_node_id == 1001
                and m.metadata.message_type == MessageType.TRAIN]
        assert [m.content.config_records[rk.CONFIG][rk.CLIENT_ID] for m in sent] == [1, 1, 1]
    assert all(a.tobytes() == b.tobytes() for a, b in zip(*finals, strict=True))


def test_a_device_node_without_a_registry_entry_is_refused(
        tmp_path: Path, flwr_log: pytest.LogCaptureFixture) -> None:
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps({"1000": 0, "1002": 2}))
    c = RunConfig.parse({**SMALL, "node-registry": str(registry)})
    grid = InProcessGrid(3, c.to_dict())
    grid.contexts[1001].node_config.clear()
    with pytest.raises(FederationError, match=r"only 2 of num-clients=3 .*refused: node 1001: "
                                              "it has no partition-id and its node id is not"):
        Fleet(grid, c).discover()


def test_min_clients_starts_with_fewer_and_times_out_with_the_reason(tmp_path: Path) -> None:
    c = RunConfig.parse({**SMALL, "min-clients": 2, "node-wait-timeout": 2.0})
    grid = InProcessGrid(3, c.to_dict())
    del grid.contexts[1002]
    fleet = Fleet(grid, c)
    assert fleet.discover() == {0: 1000, 1: 1001}
    assert fleet.available() == [0, 1]
    del grid.contexts[1001]
    c3 = RunConfig.parse({**SMALL, "min-clients": 3, "node-wait-timeout": 2.0})
    with pytest.raises(FederationError, match="only 1 of min-clients=3 SuperNodes connected"):
        Fleet(grid, c3).discover()


def message_for(client_id: int) -> Message:
    conf = ConfigRecord({rk.CLIENT_ID: client_id})
    return Message(content=RecordDict({rk.CONFIG: conf}), message_type=MessageType.TRAIN,
                   dst_node_id=1)


@pytest.mark.parametrize("node_config, client_id, want", [
    ({"partition-id": 1}, 1, 1),
    ({"partition-id": 1}, None, 1),
    ({}, 2, 2),
    ({"partition-id": 1}, 2, "client-id=2, this node holds partition-id=1: refused"),
    ({}, None, "names no client-id"),
    ({}, 5, "client id 5 is outside 0..2"),
])
def test_partition_of_reads_the_node_config_then_the_message(
        node_config: dict[str, Any], client_id: int | None, want: int | str) -> None:
    cfg = RunConfig.parse({"num-clients": 3})
    ctx = Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(),
                  run_config={})
    msg = None if client_id is None else message_for(client_id)
    if isinstance(want, int):
        assert partition_of(ctx, cfg, msg) == want
    else:
        with pytest.raises(ValueError, match=want):
            partition_of(ctx, cfg, msg)
