"""Flower's simulation engine in this process, without Ray: the real parts, one swapped.

The ServerApp gets Flower's ``InMemoryGrid`` over an in-memory LinkState, the nodes are
registered and given their Contexts by the engine's own functions (``vce_api``), and the
engine's own loop (``vce_api.run_api``: queue, workers, retrieve and update of each node's
Context) delivers the messages. Only the Ray backend is replaced by one that calls the
ClientApp in this process; like Ray, it hands the ClientApp a pickled copy of the Context and
returns the copy, so what the engine keeps of a node is what came back from the ClientApp.
"""

from __future__ import annotations

import dataclasses
import pickle
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.compat.client.run_info_store import DeprecatedRunInfoStore
from flwr.proto.task_pb2 import Task  # pylint: disable=no-name-in-module
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.fleet.vce.backend.backend import Backend, BackendConfig
from flwr.server.superlink.fleet.vce.metrics import VceMetrics
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState, RunRecord
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

REPO = Path(__file__).resolve().parents[1]
RUN_ID, TASK_ID = 7, 11


class InProcessBackend(Backend):
    """Runs the ClientApp in the calling thread on a pickled copy of the Context (as Ray)."""

    def __init__(self, backend_config: BackendConfig) -> None:
        super().__init__(backend_config)
        self.app_fn: Callable[[], ClientApp] | None = None

    def build(self, app_fn: Callable[[], ClientApp]) -> None:
        self.app_fn = app_fn

    @property
    def num_workers(self) -> int:
        return 1

    def is_worker_idle(self) -> bool:
        return True

    def terminate(self) -> None:
        pass

    def process_message(self, message: Message, context: Context) -> tuple[Message, Context]:
        assert self.app_fn is not None
        copy: Context = pickle.loads(pickle.dumps(context))
        reply = self.app_fn()(message=message, context=copy)
        return reply, pickle.loads(pickle.dumps(copy))


class InProcessSimulation:
    """``num_nodes`` simulated nodes behind Flower's InMemoryGrid, run config ``overrides``."""

    def __init__(self, num_nodes: int, overrides: dict[str, Any]) -> None:
        factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(),
                                   ObjectStoreFactory())
        self.factory = factory
        self.run = dataclasses.replace(Run.create_empty(RUN_ID), override_config=overrides,
                                       primary_task_id=TASK_ID,
                                       federation_id=NOOP_FEDERATION_ID)
        state = factory.state()
        assert isinstance(state, InMemoryLinkState)
        state.run_ids[RUN_ID] = RunRecord(run=self.run)
        state.task_store[TASK_ID] = Task(task_id=TASK_ID, run_id=RUN_ID)
        self.grid = InMemoryGrid(state_factory=factory)
        self.grid.set_run(self.run)
        self.mapping = vce_api._register_nodes(num_nodes, factory)
        self.stores: dict[int, DeprecatedRunInfoStore] = vce_api._register_node_info_stores(
            self.mapping, self.run, app_dir=str(REPO))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def contexts(self) -> list[Context]:
        """Every node's Context as the engine keeps it now."""
        return [s.retrieve_context(RUN_ID) for s in self.stores.values()]

    def __enter__(self) -> InProcessSimulation:
        from client_app.app import app

        TaskIdentity.run_id, TaskIdentity.task_id = RUN_ID, TASK_ID
        TaskIdentity.node_id = SUPERLINK_NODE_ID  # the ServerApp's messages come from the link
        self._thread = threading.Thread(
            target=vce_api.run_api, daemon=True,
            args=(lambda: app, lambda: InProcessBackend({}), self.mapping, self.factory,
                  self.stores, self._stop, VceMetrics()))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
