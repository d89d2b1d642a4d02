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


def wait_for_nodes(grid: Grid, cfg: RunConfig) -> list[int]:
    """Node ids once ``num-clients`` nodes are connected; FederationError on timeout/excess."""
    deadline = time.monotonic() + cfg.node_wait_timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) > cfg.num_clients:
            raise FederationError(
                f"{len(nodes)} SuperNodes are connected but num-clients={cfg.num_clients}; "
                + _size_hint(cfg))
        if len(nodes) == cfg.num_clients:
            return nodes
        if time.monotonic() > deadline:
            raise FederationError(
                f"only {len(nodes)} of num-clients={cfg.num_clients} SuperNodes connected "
                f"within node-wait-timeout={cfg.node_wait_timeout:g}s; " + _size_hint(cfg))
        time.sleep(1.0)


def discover_clients(grid: Grid, cfg: RunConfig) -> dict[int, int]:
    """{partition id: node id} for all ``num-clients`` clients, checked for completeness."""
    nodes = wait_for_nodes(grid, cfg)
    messages = [Message(content=RecordDict(), message_type=MessageType.QUERY, dst_node_id=n)
                for n in nodes]
    replies = list(grid.send_and_receive(messages, timeout=cfg.node_wait_timeout))
    node_of: dict[int, int] = {}
    for reply in replies:
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
        if pid in node_of:
            raise FederationError(f"nodes {node_of[pid]} and {node} both hold partition-id={pid}")
        node_of[pid] = node
    if len(node_of) != cfg.num_clients:
        missing = sorted(set(range(cfg.num_clients)) - set(node_of))
        raise FederationError(f"no reply to the identity query from partitions {missing[:10]}")
    log(INFO, "federation: %d clients connected and identified", len(node_of))
    return node_of
