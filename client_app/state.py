"""Per-client state kept between participations in ``context.state`` (one node = one client).

Flower persists ``context.state`` per node and run (in the simulation process, or in the
SuperNode's memory in a deployment). Each entry is a model-shaped list of arrays.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, RecordDict

W_PREV = "w_prev"
"""RI: the client's final local model of its last participation (w_0 before the first)."""


class ClientState:
    """Typed access to the model-shaped arrays a client keeps in ``context.state``."""

    def __init__(self, store: RecordDict) -> None:
        self._store = store

    def get(self, key: str) -> list[np.ndarray] | None:
        """The stored arrays under ``key``, or None if this client never stored them."""
        if key not in self._store.array_records:
            return None
        return self._store.array_records[key].to_numpy_ndarrays()

    def put(self, key: str, arrays: list[np.ndarray]) -> None:
        """Store (replace) the arrays under ``key``."""
        self._store[key] = ArrayRecord([np.ascontiguousarray(a) for a in arrays])
