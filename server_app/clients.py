"""Who is connected: map each client's partition id to the node that holds it.

The server asks every SuperNode for its ``partition-id`` once at start, so sampling is by
client id (seeded) and a simulation and a deployment of one experiment pick the same clients.
In a simulation Flower's engine already assigned them: the map is read from its node list and
checked with three queries, not N (server_app/simulation.py).
A federation whose size does not match ``num-clients`` is refused with a clear message
instead of hanging or silently training on part of the clients.

Who may hold which partition: with ``node-registry`` (a JSON file ``{node id: partition id}``
the operator writes when registering node keys; deploy_local.py and compose_run.sh do) a node
is used only for the partition registered to its id, so a node cannot take over another
client's partition by claiming it. Without a registry (insecure deployments) a node's claim
is trusted, but a partition held by a connected node is never handed to a second one.
Replacing a node: unregister the old key, register the new one, put the new node id in
the registry, resume.
"""

from __future__ import annotations

import json
import time
from logging import INFO, WARNING
from pathlib import Path
from typing import cast

from flwr.app import Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.superlink.grid import InMemoryGrid

from server_app.simulation import in_simulation, nodes_in_registration_order
from strategies import records as rk
from task.config import RunConfig


class FederationError(RuntimeError):
    """The connected SuperNodes do not form the federation the run config describes."""


def _size_hint(cfg: RunConfig) -> str:
    return (f"set the federation size to num-clients={cfg.num_clients} (simulation: "
            f"--federation-config \"num-supernodes={cfg.num_clients}\"), or pass "
            f"--run-config \"num-clients=<number of SuperNodes>\"")


def load_registry(cfg: RunConfig) -> dict[int, int] | None:
    """{node id: partition id} from ``node-registry``, checked; None when there is none."""
    if not cfg.node_registry:
        return None
    path = Path(cfg.node_registry)
    try:
        raw = json.loads(path.read_text())
        registry = {int(node): int(pid) for node, pid in raw.items()}
    except (OSError, ValueError, AttributeError, TypeError) as err:
        raise FederationError(f"node-registry {path}: not a readable JSON object of "
                              f"node id -> partition id ({err})") from None
    bad = sorted(p for p in registry.values() if not 0 <= p < cfg.num_clients)
    if bad:
        raise FederationError(f"node-registry {path}: partition-id {bad[0]} is outside "
                              f"0..{cfg.num_clients - 1}")
    if len(set(registry.values())) != len(registry):
        raise FederationError(f"node-registry {path}: a partition is registered to two nodes")
    return registry


def _refuse(node: int, reason: str) -> None:
    log(WARNING, "refused node %d: %s", node, reason)


def _allowed(claims: dict[int, int], registry: dict[int, int] | None,
             held: dict[int, int], connected: set[int]) -> dict[int, int]:
    """The claims {node: partition} that may stand; the others are refused and logged.

    ``held`` is {partition: node} as used so far; ``connected`` the nodes now connected.
    The registry, when there is one, is the authority (a replaced node takes its partition
    over even while the old one still looks connected).
    """
    ok: dict[int, int] = {}
    for node, pid in sorted(claims.items()):
        if registry is not None and node not in registry:
            _refuse(node, f"it claims partition-id={pid} but its node id is not in node-registry")
            continue
        if registry is not None and registry[node] != pid:
            _refuse(node, f"it claims partition-id={pid}, node-registry gives it "
                          f"partition-id={registry[node]}")
            continue
        holder = held.get(pid, next((n for n, p in ok.items() if p == pid), None))
        if registry is None and holder not in (None, node) and holder in connected:
            _refuse(node, f"it claims partition-id={pid}, held by connected node {holder}")
            continue
        ok[node] = pid
    return ok


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
    In a simulation the engine's own assignment is read instead (``_simulated_clients``).
    """
    if in_simulation(grid):
        return _simulated_clients(cast(InMemoryGrid, grid), cfg)
    deadline = time.monotonic() + cfg.node_wait_timeout
    registry = load_registry(cfg)
    pid_of: dict[int, int] = {}
    seen: set[int] = set()
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) > cfg.num_clients and registry is None:
            raise FederationError(
                f"{len(nodes)} SuperNodes are connected but num-clients={cfg.num_clients}; "
                + _size_hint(cfg))
        new = [n for n in nodes if n not in seen]
        if new:
            claims = _identify(grid, cfg, new)
            seen.update(claims)  # a node that did not answer yet is asked again
            held = {p: n for n, p in pid_of.items()}
            pid_of.update(_allowed(claims, registry, held, set(nodes)))
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


def _simulated_clients(grid: InMemoryGrid, cfg: RunConfig) -> dict[int, int]:
    """{partition id: node id} as Flower's simulation engine assigned them, read from its
    node list (server_app/simulation.py) instead of asking each of the N nodes: three
    queries in all. The engine registers every node before it runs any ClientApp, so the
    answers of the first two nodes (asked together: on a 2-core machine that loads the
    ClientApp in both actors at once) also say the node list is complete; they and the last
    node's answer check the size (num-partitions) and that list order is partition order."""
    if cfg.node_registry:
        raise FederationError(f"node-registry={cfg.node_registry!r} is for deployments; a "
                              "simulation's node ids are new in every run: leave it empty")
    deadline = time.monotonic() + cfg.node_wait_timeout
    order = nodes_in_registration_order(grid)
    while not order:
        if time.monotonic() > deadline:
            raise FederationError(f"no simulated SuperNode registered within "
                                  f"node-wait-timeout={cfg.node_wait_timeout:g}s")
        time.sleep(0.1)
        order = nodes_in_registration_order(grid)
    claims = _identify(grid, cfg, order[:2])
    order = nodes_in_registration_order(grid)
    if len(order) != cfg.num_clients:
        raise FederationError(f"the simulation has {len(order)} SuperNodes but "
                              f"num-clients={cfg.num_clients}; " + _size_hint(cfg))
    spots = {pid: order[pid] for pid in {0, min(1, len(order) - 1), len(order) - 1}}
    missing = [node for node in spots.values() if node not in claims]
    if missing:
        claims.update(_identify(grid, cfg, missing))
    for pid, node in sorted(spots.items()):
        if node not in claims:
            raise FederationError(f"simulated node {node} did not answer the identity query "
                                  f"within node-wait-timeout={cfg.node_wait_timeout:g}s")
        if claims[node] != pid:
            raise FederationError(f"simulated node {node} holds partition-id={claims[node]}, "
                                  f"not {pid} as its place in the engine's node list says "
                                  "(has Flower's node registration changed?)")
    log(INFO, "federation: %d simulated clients, partition ids from the engine", len(order))
    return dict(enumerate(order))


def refresh_clients(grid: Grid, cfg: RunConfig, node_of: dict[int, int],
                    refused: set[int]) -> None:
    """Re-identify nodes that (re)joined since the last round, updating ``node_of`` in place.

    A SuperNode that restarts without a stable identity comes back under a new node id; its
    partition id maps the client to the new node, so it rejoins with its saved state.
    """
    connected = set(grid.get_node_ids())
    new = sorted(connected - set(node_of.values()) - refused)
    if not new:
        return
    claims = _identify(grid, cfg, new)
    registry = load_registry(cfg)
    allowed = _allowed(claims, registry, node_of, connected)
    if registry is not None:  # refused for good: not asked again (each costs a round trip)
        refused.update(set(claims) - set(allowed))
    for node, pid in allowed.items():
        log(INFO, "client %d is now on node %d", pid, node)
        node_of[pid] = node
