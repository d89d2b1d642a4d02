"""Partitions bound to node identities: no node takes over another client's partition."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from server_app.clients import FederationError, Fleet, discover_clients

pytestmark = pytest.mark.usefixtures("fake_clock")


def cfg(tmp: Path, registry: dict[int, int] | None = None) -> RunConfig:
    over: dict[str, object] = {"num-clients": 3, "node-wait-timeout": 3.0}
    if registry is not None:
        path = tmp / "registry.json"
        path.write_text(json.dumps({str(k): v for k, v in registry.items()}))
        over["node-registry"] = str(path)
    return RunConfig.parse(over)


def refresh(fleet: Fleet) -> None:
    """One round's identification: answers of the last round, queries to new nodes (the
    in-process grid answers at once), and their answers."""
    fleet.collect()
    fleet.ask()
    fleet.collect()


def add_node(grid: InProcessGrid, node: int, cid: int) -> None:
    """A late SuperNode that says it holds partition ``cid``."""
    grid.contexts[node] = Context(run_id=1, node_id=node,
                                  node_config={"partition-id": cid, "num-partitions": 3},
                                  state=RecordDict(), run_config={})


@pytest.fixture
def caplog_warn(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    logging.getLogger("flwr").propagate = True
    caplog.set_level(logging.WARNING, logger="flwr")
    return caplog


def test_a_late_node_cannot_claim_a_held_partition(
        tmp_path: Path, caplog_warn: pytest.LogCaptureFixture) -> None:
    c = cfg(tmp_path)
    grid = InProcessGrid(3, c.to_dict())
    fleet = Fleet(grid, c)
    node_of = fleet.discover()
    assert node_of == {0: 1000, 1: 1001, 2: 1002}
    add_node(grid, 6666, 0)
    refresh(fleet)
    assert node_of[0] == 1000
    assert "refused node 6666: it claims partition-id=0, held by connected node 1000" \
        in caplog_warn.text
    assert 6666 not in fleet.refused  # may hold it later: asked again after RETRY_SECONDS
    # The holder gone (a node restarted without a stable identity): its successor takes over.
    del grid.contexts[1000]
    fleet.retry_at.clear()
    refresh(fleet)
    assert node_of[0] == 6666


def test_the_registry_decides_who_holds_which_partition(
        tmp_path: Path, caplog_warn: pytest.LogCaptureFixture) -> None:
    c = cfg(tmp_path, {1000: 0, 1001: 1, 1002: 2})
    grid = InProcessGrid(3, c.to_dict())
    fleet = Fleet(grid, c)
    node_of = fleet.discover()
    assert node_of == {0: 1000, 1: 1001, 2: 1002}
    add_node(grid, 6666, 1)  # registered to no partition
    add_node(grid, 1001_000, 2)  # unknown node id
    refresh(fleet)
    assert node_of == {0: 1000, 1: 1001, 2: 1002}
    assert fleet.refused == {6666, 1001_000}
    assert "refused node 6666: it claims partition-id=1 but its node id is not in " \
        "node-registry" in caplog_warn.text

    # Replacement: the operator registers the new node's key and maps its id to partition 1
    # in the registry file, which the run reads again each round.
    cfg(tmp_path, {1000: 0, 7777: 1, 1002: 2})
    add_node(grid, 7777, 1)
    refresh(fleet)
    assert node_of[1] == 7777  # even while the old node still looks connected


def test_a_node_claiming_another_partition_than_registered_is_refused(
        tmp_path: Path, caplog_warn: pytest.LogCaptureFixture) -> None:
    c = cfg(tmp_path, {1000: 0, 1001: 2, 1002: 1})  # 1001 says 1, registered for 2
    with pytest.raises(FederationError, match="only 1 of num-clients=3"):
        discover_clients(InProcessGrid(3, c.to_dict()), c)
    assert "refused node 1001: it claims partition-id=1, node-registry gives it " \
        "partition-id=2" in caplog_warn.text


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "not a readable JSON object"),
    ('{"5": 3}', "partition-id 3 is outside 0..2"),
    ('{"5": 1, "6": 1}', "a partition is registered to two nodes"),
])
def test_a_bad_registry_is_one_line(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "r.json").write_text(content)
    c = RunConfig.parse({"num-clients": 3, "node-registry": str(tmp_path / "r.json")})
    with pytest.raises(FederationError, match=message):
        discover_clients(InProcessGrid(3, c.to_dict()), c)
