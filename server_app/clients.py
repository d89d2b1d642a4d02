"""Who is connected: map each client's partition id to the node that holds it.

The server asks every SuperNode for its ``partition-id`` once at start, so sampling is by
client id (seeded) and a simulation and a deployment of one experiment pick the same clients.
A federation whose size does not match ``num-clients`` is refused with a clear message
instead of hanging or silently training on part of the clients.
"""

from __future__ import annotations

import time
from logging import INFO

from flwr.app import Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid

from strategies import records as rk
from task.config import RunConfig


class FederationError(RuntimeError):
    """The connected SuperNodes do not form the federation the run config describes."""


def _size_hint(cfg: RunConfig) -> str:
    return (f"set the federation size to num-clients={cfg.num_clients} (simulation: "
            f"--federation-config \"num-supernodes={cfg.num_clients}\"), or pass "
            f"--run-config \"num-clients=<number of SuperNodes>\"")


def _identify(grid: Grid, cfg: RunConfig, nodes: list[int]) -> dict[int, int]:
    """{node id: partition id} of ``nodes`` via a query message; checks each answer."""
    messages = [Message(content=RecordDict(), message_type=MessageType.QUERY, dst_node_id=n)
                for n in nodes]
    found: dict[int, int] = {}
    for reply in grid.send_and_receive(messages, timeout=cfg.node_wait_timeout):
        node = reply.metadata.src_node_id
        if reply.has_error():
            raise FederationError(f"node {node} failed the identity query: {reply.error.reason}")
        info = reply.content.config_records[rk.CONFIG]
        pid, n_parts = int(info[rk.PARTITION_ID]), int(info[rk.NUM_PARTITIONS])
        if n_parts != cfg.num_clients:
            raise FederationError(
                f"node {node} has num-partitions={n_parts} but num-clients={cfg.num_clients}; "
                + _size_hint(cfg))
        if not 0 <= pid < cfg.num_clients:
            raise FederationError(f"node {node} has partition-id={pid}, outside "
                                  f"0..{cfg.num_clients - 1}")
        found[node] = pid
    return found


def discover_clients(grid: Grid, cfg: RunConfig) -> dict[int, int]:
    """{partition id: node id} for all ``num-clients`` clients.

    Nodes are identified as they connect, so a node that knows a different federation size
    (num-partitions) stops the run at once; too few nodes stop it after node-wait-timeout.
    """
    deadline = time.monotonic() + cfg.node_wait_timeout
    pid_of: dict[int, int] = {}
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) > cfg.num_clients:
            raise FederationError(
                f"{len(nodes)} SuperNodes are connected but num-clients={cfg.num_clients}; "
                + _size_hint(cfg))
        new = [n for n in nodes if n not in pid_of]
        if new:
            pid_of.update(_identify(grid, cfg, new))
        if len(pid_of) == cfg.num_clients:
            break
        if time.monotonic() > deadline:
            raise FederationError(
                f"only {len(pid_of)} of num-clients={cfg.num_clients} SuperNodes connected "
                f"within node-wait-timeout={cfg.node_wait_timeout:g}s; " + _size_hint(cfg))
        time.sleep(1.0)
    node_of: dict[int, int] = {}
    for node, pid in pid_of.items():
        if pid in node_of:
            raise FederationError(f"nodes {node_of[pid]} and {node} both hold partition-id={pid}")
        node_of[pid] = node
    log(INFO, "federation: %d clients connected and identified", len(node_of))
    return node_of


def refresh_clients(grid: Grid, cfg: RunConfig, node_of: dict[int, int]) -> None:
    """Re-identify nodes that (re)joined since the last round, updating ``node_of`` in place.

    A SuperNode that restarts without a stable identity comes back under a new node id; its
    partition id maps the client to the new node, so it rejoins with its saved state.
    """
    known = set(node_of.values())
    new = [n for n in sorted(grid.get_node_ids()) if n not in known]
    if not new:
        return
    for node, pid in _identify(grid, cfg, new).items():
        if node_of.get(pid) != node:
            log(INFO, "client %d is now on node %d", pid, node)
        node_of[pid] = node
