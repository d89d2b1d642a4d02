"""Who is connected: map each client id to the node that holds it, as nodes come and go.

The server asks every SuperNode who it is (a QUERY message), so sampling is by client id
(seeded) and a simulation and a deployment of one experiment pick the same clients. A client
id is the node's benchmark ``partition-id``; a node without one (device-local data) is the
client its ``node-registry`` entry names. In a simulation Flower's engine already assigned the
ids: the map is read from its node list and checked with three queries, not N
(server_app/engine_facts.py).

A deployment changes under the run: ``Fleet.discover`` waits for ``min-clients`` identified
clients (default all ``num-clients``); later nodes are asked beside the rounds (``ask`` pushes
the queries before a round's train messages, ``collect`` pulls whatever answers came, never
waiting), so a newcomer takes part from its next sampled round and a node that never answers
costs no round anything. A wrong answer (another ``num-partitions``, an id out of range, a
claim the registry contradicts) refuses the node for good; an error reply (the SuperLink's
``Node Unavailable`` for a node in reconnect back-off, a raising query handler) leaves it to be
asked again later. Each refusal is logged once.

Who may hold which client: with ``node-registry`` (a JSON file ``{node id: client id}`` the
operator writes when registering node keys; deploy_local.py and compose_run.sh do) a node is
used only for the client registered to its id, so a node cannot take over another client by
claiming it. Without a registry (insecure deployments) a node's claim is trusted, but a
client held by a connected node is never handed to a second one. Replacing a node: unregister
the old key, register the new one, put the new node id in the registry (read again each
round).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from logging import INFO, WARNING
from pathlib import Path
from typing import cast

from flwr.app import Message, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.superlink.grid import InMemoryGrid

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from server_app.engine_facts import in_simulation, nodes_in_registration_order

RETRY_SECONDS = 10.0
"""A node whose identity query got an error reply (or whose claim may become valid, e.g. a
client still held by another connected node) is asked again after this long."""
POLL_SECONDS = 1.0
"""How often the start polls for connected nodes and identity answers."""
IDENTITY_WAIT_SECONDS = 10.0
"""How long a node's identity query may go unanswered before the log says it is waited for."""


class FederationError(RuntimeError):
    """The connected SuperNodes do not form the federation the run config describes."""


def _size_hint(cfg: RunConfig) -> str:
    return (f"set the federation size to num-clients={cfg.num_clients} (simulation: "
            f"--federation-config \"num-supernodes={cfg.num_clients}\"), or pass "
            f"--run-config \"num-clients=<number of SuperNodes>\"")


def load_registry(cfg: RunConfig) -> dict[int, int] | None:
    """{node id: client id} from ``node-registry``, checked; None when there is none."""
    if not cfg.fleet.node_registry:
        return None
    path = Path(cfg.fleet.node_registry)
    try:
        raw = json.loads(path.read_text())
        registry = {int(node): int(cid) for node, cid in raw.items()}
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


@dataclass(frozen=True)
class Refusal:
    """Why a node's identity answer cannot stand (one line); ``final``: never ask again,
    else the node is asked again after RETRY_SECONDS (the answer may change)."""

    reason: str
    final: bool = True


def claimed_id(reply: Message, cfg: RunConfig, registry: dict[int, int] | None,
               node: int) -> int | Refusal:
    """The client id a node's identity answer gives it, or why it is refused.

    A benchmark node answers its ``partition-id`` and ``num-partitions``; a node with its own
    data answers partition-id -1 and is the client the registry names.
    """
    if reply.has_error():
        return Refusal(f"the identity query failed: {reply.error.reason}", final=False)
    info = reply.content.config_records.get(rk.CONFIG)
    try:
        cid = int(info[rk.PARTITION_ID]) if info is not None else -2
        n_parts = int(info.get(rk.NUM_PARTITIONS, -1)) if info is not None else -1
    except (KeyError, TypeError, ValueError):
        cid = -2
    if cid == -2:
        return Refusal(f"its identity answer has no {rk.CONFIG!r} record with an integer "
                       f"{rk.PARTITION_ID!r}")
    if n_parts != -1 and n_parts != cfg.num_clients:
        return Refusal(f"it has num-partitions={n_parts} but num-clients={cfg.num_clients}")
    if cid == -1:
        if registry is None:
            return Refusal("it has no partition-id and no node-registry names its client id")
        if node not in registry:
            return Refusal("it has no partition-id and its node id is not in node-registry")
        return registry[node]
    if not 0 <= cid < cfg.num_clients:
        return Refusal(f"it has partition-id={cid}, outside 0..{cfg.num_clients - 1}")
    if registry is not None and node not in registry:
        return Refusal(f"it claims partition-id={cid} but its node id is not in node-registry")
    if registry is not None and registry[node] != cid:
        return Refusal(f"it claims partition-id={cid}, node-registry gives it "
                       f"partition-id={registry[node]}")
    return cid


class Fleet:
    """The clients of a run: {client id: node id} (``node_of``), kept current round by round.

    ``node_of`` is one dict for the whole run (the strategy holds it); ``available`` says which
    of its clients may be sampled now.
    """

    def __init__(self, grid: Grid, cfg: RunConfig) -> None:
        self.grid, self.cfg = grid, cfg
        self.simulated = in_simulation(grid)
        self.registry = load_registry(cfg)
        self.node_of: dict[int, int] = {}
        self.refused: set[int] = set()
        """Nodes refused for good: never asked again."""
        self.pending: dict[str, int] = {}
        """Identity queries without an answer yet: {message id: node id}."""
        self.asked_at: dict[int, float] = {}
        """When each node's pending identity query was pushed (monotonic)."""
        self.said_waiting: set[int] = set()
        """Nodes already logged as waiting for their identity answer (said once)."""
        self.retry_at: dict[int, float] = {}
        """Nodes to ask again, with the monotonic time they may be asked."""
        self.reasons: dict[int, str] = {}
        """The last refusal of each refused node (said once in the log, and in a start error)."""
        self._registry_error = ""
        self.seen_at: dict[int, float] = {}
        """When each node last answered its identity query (wall clock, for the status page)."""
        self.connected: set[int] = set()
        """The nodes the SuperLink said were connected the last time it was asked."""
        self.connected_at: dict[int, float] = {}
        """When each node was last among them (wall clock, for the status page)."""
        self.on_change: Callable[[], None] | None = None
        """Called after an answer placed or refused a node, or a node was said waiting
        (server_app/status.py rewrites the status file)."""

    # ------------------------------------------------------------------ start
    def discover(self) -> dict[int, int]:
        """Wait until ``min-clients`` (0: all ``num-clients``) clients are identified.

        Too few within node-wait-timeout stops the run with the reason; so do more nodes than
        ``num-clients`` without a registry (the federation is not the one configured).
        """
        if self.simulated:
            self.node_of.update(_simulated_clients(cast(InMemoryGrid, self.grid), self.cfg))
            self.online()  # asked once: the engine's nodes never miss a heartbeat
            return self.node_of
        cfg = self.cfg
        need = cfg.fleet.min_clients or cfg.num_clients
        deadline = time.monotonic() + cfg.fleet.node_wait_timeout
        while True:
            nodes = self.online()
            if len(nodes) > cfg.num_clients and self.registry is None:
                raise FederationError(
                    f"{len(nodes)} SuperNodes are connected but num-clients={cfg.num_clients}; "
                    + _size_hint(cfg))
            self.ask(nodes)
            self.collect()
            if len(self.node_of) >= need:
                break
            if time.monotonic() > deadline:
                what = (f"min-clients={cfg.fleet.min_clients}" if cfg.fleet.min_clients
                        else f"num-clients={cfg.num_clients}")
                refused = "; ".join(f"node {n}: {r}" for n, r in sorted(self.reasons.items()))
                silent = sorted(self.pending.values())
                raise FederationError(
                    f"only {len(self.node_of)} of {what} SuperNodes connected and identified "
                    f"within node-wait-timeout={cfg.fleet.node_wait_timeout:g}s; " + _size_hint(cfg)
                    + f"; or set min-clients={max(1, len(self.node_of))} to start with the "
                    "clients identified and let the others join as they come"
                    + (f" (refused: {refused})" if refused else "")
                    + (f" (no identity answer yet from node {', '.join(map(str, silent))})"
                       if silent else ""))
            time.sleep(POLL_SECONDS)
        log(INFO, "federation: %d of %d clients connected and identified", len(self.node_of),
            cfg.num_clients)
        return self.node_of

    # ------------------------------------------------------------------ each round
    def ask(self, connected: Iterable[int] | None = None) -> None:
        """Push an identity query to each connected node not yet identified, asked or
        refused; returns at once (``collect`` takes the answers)."""
        if self.simulated:
            return
        self._reload_registry()
        nodes = self.online() if connected is None else set(connected)
        now = time.monotonic()
        skip = set(self.node_of.values()) | self.refused | set(self.pending.values())
        new = sorted(n for n in nodes - skip if self.retry_at.get(n, 0.0) <= now)
        if not new:
            return
        messages = [Message(content=RecordDict(), message_type=MessageType.QUERY,
                            dst_node_id=n) for n in new]
        for node, msg_id in zip(new, list(self.grid.push_messages(messages)), strict=True):
            if msg_id:
                self.pending[msg_id] = node
                self.asked_at.setdefault(node, now)
                self.retry_at.pop(node, None)

    def collect(self) -> list[int]:
        """Take the identity answers that came (never waits); the client ids newly placed.
        A node still silent IDENTITY_WAIT_SECONDS after its query is logged once as
        waiting for its identity (registered with the SuperLink, not yet a client)."""
        if not self.pending:
            return []
        placed, answered = [], 0
        for reply in self.grid.pull_messages(list(self.pending)):
            node = self.pending.pop(reply.metadata.reply_to_message_id, None)
            if node is None:
                continue
            answered += 1
            self.seen_at[node] = time.time()
            self.asked_at.pop(node, None)
            claim = claimed_id(reply, self.cfg, self.registry, node)
            if isinstance(claim, int):
                claim = self._holder_problem(node, claim)
            if isinstance(claim, Refusal):
                self._refuse(node, claim)
                continue
            if claim in self.node_of and self.node_of[claim] != node:
                log(INFO, "client %d is now on node %d", claim, node)
            self.node_of[claim] = node
            self.reasons.pop(node, None)
            placed.append(claim)
        said = self._say_waiting()
        if (answered or said) and self.on_change is not None:
            self.on_change()
        return placed

    def _say_waiting(self) -> int:
        """Log each node silent for IDENTITY_WAIT_SECONDS, once; how many were new."""
        now, before = time.monotonic(), len(self.said_waiting)
        for node in sorted(set(self.pending.values()) - self.said_waiting):
            if now - self.asked_at.get(node, now) >= IDENTITY_WAIT_SECONDS:
                log(WARNING, "node %d is connected but has not answered its identity query "
                    "for %.0f s: waiting for its identity (it takes part once it answers)",
                    node, now - self.asked_at[node])
                self.said_waiting.add(node)
        return len(self.said_waiting) - before

    def available(self) -> list[int]:
        """Identified clients whose node is connected now (in a simulation: all of them)."""
        if self.simulated:
            return sorted(self.node_of)
        online = self.online()
        return sorted(cid for cid, node in self.node_of.items() if node in online)

    def online(self) -> set[int]:
        """The connected nodes (Flower 1.39's ``Grid.get_node_ids``), remembered with the
        time each was seen (``connected``, ``connected_at``): the status page shows this last
        answer and never asks itself (server_app/status.py)."""
        nodes = {int(n) for n in self.grid.get_node_ids()}
        now = time.time()
        self.connected = nodes
        self.connected_at.update(dict.fromkeys(nodes, now))
        return nodes

    # ------------------------------------------------------------------ helpers
    def _holder_problem(self, node: int, cid: int) -> int | Refusal:
        """Without a registry a client held by another connected node stays with it."""
        holder = self.node_of.get(cid)
        if self.registry is None and holder not in (None, node) \
                and holder in self.online():
            return Refusal(f"it claims partition-id={cid}, held by connected node {holder}",
                           final=False)
        return cid

    def _refuse(self, node: int, why: Refusal) -> None:
        """Log a refusal the first time it is given; remember whether to ask again."""
        if self.reasons.get(node) != why.reason:
            log(WARNING, "refused node %d: %s%s", node, why.reason,
                "" if why.final else f" (asked again in {RETRY_SECONDS:g}s or later)")
        self.reasons[node] = why.reason
        if why.final:
            self.refused.add(node)
        else:
            self.retry_at[node] = time.monotonic() + RETRY_SECONDS

    def _reload_registry(self) -> None:
        """The registry is read again each round: an operator may map a replacement node."""
        if not self.cfg.fleet.node_registry:
            return
        try:
            self.registry = load_registry(self.cfg)
        except FederationError as err:
            if self._registry_error != str(err):
                log(WARNING, "%s; keeping the registry read before", err)
                self._registry_error = str(err)


def discover_clients(grid: Grid, cfg: RunConfig) -> dict[int, int]:
    """{client id: node id} once the run may start (``Fleet.discover``)."""
    return Fleet(grid, cfg).discover()


def _identify(grid: Grid, cfg: RunConfig, nodes: list[int]) -> dict[int, int]:
    """{node id: partition id} of simulated ``nodes``; any wrong answer stops the run (a
    simulation's federation is the one the command line made: wrong is a setup error)."""
    messages = [Message(content=RecordDict(), message_type=MessageType.QUERY, dst_node_id=n)
                for n in nodes]
    found: dict[int, int] = {}
    for reply in grid.send_and_receive(messages, timeout=cfg.fleet.node_wait_timeout):
        node = reply.metadata.src_node_id
        claim = claimed_id(reply, cfg, None, node)
        if isinstance(claim, Refusal):
            hint = "; " + _size_hint(cfg) if "num-partitions" in claim.reason else ""
            raise FederationError(f"node {node} failed the identity query: {claim.reason}"
                                  + hint)
        found[node] = claim
    return found


def _simulated_clients(grid: InMemoryGrid, cfg: RunConfig) -> dict[int, int]:
    """{partition id: node id} as Flower's simulation engine assigned them, read from its
    node list (server_app/engine_facts.py) instead of asking each of the N nodes: three
    queries in all. The engine registers every node before it runs any ClientApp, so the
    answers of the first two nodes (asked together: on a 2-core machine that loads the
    ClientApp in both actors at once) also say the node list is complete; they and the last
    node's answer check the size (num-partitions) and that list order is partition order."""
    if cfg.fleet.node_registry:
        raise FederationError(f"node-registry={cfg.fleet.node_registry!r} is for deployments; a "
                              "simulation's node ids are new in every run: leave it empty")
    deadline = time.monotonic() + cfg.fleet.node_wait_timeout
    order = nodes_in_registration_order(grid)
    while not order:
        if time.monotonic() > deadline:
            raise FederationError(f"no simulated SuperNode registered within "
                                  f"node-wait-timeout={cfg.fleet.node_wait_timeout:g}s")
        time.sleep(0.1)
        order = nodes_in_registration_order(grid)
    claims = _identify(grid, cfg, order[:2])
    order = nodes_in_registration_order(grid)
    if len(order) != cfg.num_clients:
        raise FederationError(f"the simulation has {len(order)} SuperNodes but "
                              f"num-clients={cfg.num_clients}; " + _size_hint(cfg))
    spots = {cid: order[cid] for cid in {0, min(1, len(order) - 1), len(order) - 1}}
    missing = [node for node in spots.values() if node not in claims]
    if missing:
        claims.update(_identify(grid, cfg, missing))
    for cid, node in sorted(spots.items()):
        if node not in claims:
            raise FederationError(f"simulated node {node} did not answer the identity query "
                                  f"within node-wait-timeout={cfg.fleet.node_wait_timeout:g}s")
        if claims[node] != cid:
            raise FederationError(f"simulated node {node} holds partition-id={claims[node]}, "
                                  f"not {cid} as its place in the engine's node list says "
                                  "(has Flower's node registration changed?)")
    log(INFO, "federation: %d simulated clients, partition ids from the engine", len(order))
    return dict(enumerate(order))
