"""The client store: one client's state between its participations, behind one object.

The state is w_prev (RI) and the method's model-shaped arrays (c_i, h_i, ...), tagged with the
experiment and round that produced it. Two places may hold it:

- memory: a Flower ``RecordDict`` (``context.state``, kept per node and run: in the simulation
  process, or in a SuperNode's memory), or nothing;
- disk: a ``StateDir`` (a node's ``state-dir``, or the run's ``client-state-dir``), or nothing.

With both, memory is used while it is the right version and disk survives restarts and
resumes. Memory alone is Flower's default. Disk alone keeps nothing between rounds: the state
is read at ``restore`` and written at ``save``, so a simulation's memory does not grow with the
number of clients; choose it by passing ``memory=None``.
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import WARNING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.common.logger import log

from store.state_dir import Entries, Shaped, StateDir

W_PREV = "w_prev"
"""RI: the client's final local model of its last participation (w_0 before the first)."""
TAG = "client-meta"
"""The memory entry (a ConfigRecord) holding the state's experiment and round."""


class ClientStore:
    """One client's state: typed access in memory, restored from and saved to disk."""

    def __init__(self, memory: RecordDict | None = None, disk: StateDir | None = None) -> None:
        """``memory=None``: the state lives in this object only, for one participation."""
        self._mem = memory if memory is not None else RecordDict()
        self.disk = disk

    def get(self, key: str) -> list[np.ndarray] | None:
        """The stored arrays under ``key``, or None if this client never stored them."""
        if key not in self._mem.array_records:
            return None
        return self._mem.array_records[key].to_numpy_ndarrays()

    def put(self, key: str, arrays: list[np.ndarray]) -> None:
        """Store (replace) the arrays under ``key``."""
        self._mem[key] = ArrayRecord([np.ascontiguousarray(a) for a in arrays])

    def snapshot(self) -> ClientStore:
        """A store to read this client's state from without changing it (evaluation): its
        memory is a new RecordDict holding the same records, which ``restore`` may replace
        but never writes into; its disk is the same directory, which ``restore`` only reads
        (a damaged file is renamed, as any restore would)."""
        return ClientStore(memory=RecordDict(dict(self._mem.items())), disk=self.disk)

    def entries(self) -> Entries:
        return {k: v.to_numpy_ndarrays() for k, v in self._mem.array_records.items()}

    def replace(self, entries: Entries) -> None:
        """Drop every stored array entry and store ``entries`` instead."""
        for key in list(self._mem.array_records):
            del self._mem[key]
        for key, arrays in entries.items():
            self.put(key, arrays)

    def tag(self) -> tuple[str, int] | None:
        """(experiment id, round) of the state held, if any."""
        if TAG not in self._mem.config_records:
            return None
        meta = self._mem.config_records[TAG]
        return str(meta["experiment"]), int(meta["round"])  # type: ignore[arg-type]

    def set_tag(self, experiment: str, server_round: int) -> None:
        self._mem[TAG] = ConfigRecord({"experiment": experiment, "round": server_round})

    def restore(self, experiment: str, server_round: int, model: Sequence[Shaped]) -> bool:
        """Hold the version from this client's last participation before ``server_round``.

        Memory is used when it is that version; otherwise (node restarted, run resumed, a
        round redone after a server crash, or no memory) the newest older version on disk
        replaces it. A version that is unreadable, not this client's, wrong-shaped or not
        finite is skipped for the one before it, or w_0 (empty state): returns True then, so
        the reply can say so (the ``state-fallback`` metric).
        """
        tag = self.tag()
        if self.disk is None or (tag is not None and tag[0] == experiment
                                 and tag[1] < server_round):
            return False
        saved, problems = self.disk.load_usable_before(server_round, model)
        used = f"the state of round {saved[0]}" if saved else "w_0 (empty state)"
        for problem in problems:
            log(WARNING, "%s; falling back to %s", problem, used)
        self.replace(saved[1] if saved else {})
        if saved:
            self.set_tag(experiment, saved[0])
        return bool(problems)

    def save(self, experiment: str, server_round: int) -> None:
        """Tag the state held as this round's and write it to disk, if there is one."""
        self.set_tag(experiment, server_round)
        if self.disk is not None:
            self.disk.save(server_round, self.entries())
