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

Accounted state. A method's ``accounted_keys`` (SCAFFOLD's c_i, FedDyn's h_i) are arrays whose
changes the server sums into its own state; the server counts a change only when it aggregates
the reply that carried it. So each training message names the round of the client's last
aggregated reply (``accounted``), and ``restore`` starts those keys from that round's version
(zeros for 0), not from the newest one a late, rejected or lost reply left behind. Memory keeps
the accounted version beside the newest (``ACCOUNTED``-prefixed entries, usually the same
arrays); disk keeps its file (``StateDir.save(keep=...)``). The other keys stay the newest.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.common.logger import log

from fedinit.store.state_dir import Entries, Shaped, StateDir, StateError

W_PREV = "w_prev"
"""RI: the client's final local model of its last participation (w_0 before the first)."""
TAG = "client-meta"
"""The memory entry (a ConfigRecord) holding the state's experiment and round."""
ACCOUNTED = "accounted/"
"""Prefix of the memory entries holding the accounted keys' version the server counted."""
ACCOUNTED_TAG = "client-accounted"
"""The memory entry (a ConfigRecord) holding that version's experiment and round."""


class _Arrays:
    """A list of arrays held as they are (``ArrayRecord``'s reading side, without encoding)."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays

    def to_numpy_ndarrays(self) -> list[np.ndarray]:
        return [a.copy() for a in self.arrays]  # fresh arrays, as ArrayRecord's


class _PlainMemory:
    """The part of ``RecordDict`` the store uses, holding arrays unencoded: for a store
    whose state lives only for one participation (``memory=None``), where ArrayRecord's
    encoding and decoding of every entry (several per participation) would be pure cost."""

    def __init__(self, items: Iterable[tuple[str, object]] = ()) -> None:
        self.array_records: dict[str, object] = {}
        self.config_records: dict[str, object] = {}
        for key, value in items:
            self[key] = value

    def __setitem__(self, key: str, value: object) -> None:
        self.__delitem__(key)
        store = self.config_records if isinstance(value, ConfigRecord) else self.array_records
        store[key] = value

    def __delitem__(self, key: str) -> None:
        self.array_records.pop(key, None)
        self.config_records.pop(key, None)

    def items(self) -> list[tuple[str, object]]:
        return [*self.array_records.items(), *self.config_records.items()]


class ClientStore:
    """One client's state: typed access in memory, restored from and saved to disk."""

    def __init__(self, memory: RecordDict | None = None, disk: StateDir | None = None) -> None:
        """``memory=None``: the state lives in this object only, for one participation."""
        self._mem: Any = memory if memory is not None else _PlainMemory()
        self.disk = disk
        self._keep = 0
        """The accounted round of the last ``restore``: its disk version must stay."""

    def get(self, key: str) -> list[np.ndarray] | None:
        """The stored arrays under ``key``, or None if this client never stored them."""
        if key not in self._mem.array_records:
            return None
        return self._mem.array_records[key].to_numpy_ndarrays()

    def put(self, key: str, arrays: list[np.ndarray]) -> None:
        """Store (replace) the arrays under ``key``."""
        if isinstance(self._mem, _PlainMemory):
            self._mem[key] = _Arrays([np.array(a, order="C") for a in arrays])  # copies
        else:
            self._mem[key] = ArrayRecord([np.ascontiguousarray(a) for a in arrays])

    def snapshot(self) -> ClientStore:
        """A store to read this client's state from without changing it (evaluation): its
        memory is a new RecordDict holding the same records, which ``restore`` may replace
        but never writes into; its disk is the same directory, which ``restore`` only reads
        (a damaged file is renamed, as any restore would)."""
        if isinstance(self._mem, _PlainMemory):
            copy = ClientStore(disk=self.disk)
            copy._mem = _PlainMemory(self._mem.items())
            return copy
        return ClientStore(memory=RecordDict(dict(self._mem.items())), disk=self.disk)

    def entries(self) -> Entries:
        """The state held (without the accounted copies)."""
        return {k: v.to_numpy_ndarrays() for k, v in self._mem.array_records.items()
                if not k.startswith(ACCOUNTED)}

    def replace(self, entries: Entries) -> None:
        """Drop every stored array entry (accounted copies too) and store ``entries``."""
        for key in list(self._mem.array_records):
            del self._mem[key]
        if ACCOUNTED_TAG in self._mem.config_records:
            del self._mem[ACCOUNTED_TAG]
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

    def restore(self, experiment: str, server_round: int, model: Sequence[Shaped],
                accounted: int | None = None, accounted_keys: Sequence[str] = ()) -> bool:
        """Hold the version from this client's last participation before ``server_round``,
        with ``accounted_keys`` from round ``accounted`` when the server names one.

        Memory is used when it is that version; otherwise (node restarted, run resumed, a
        round redone after a server crash, or no memory) the newest older version on disk
        replaces it. A version that is unreadable, not this client's, wrong-shaped or not
        finite is skipped for the one before it, or w_0 (empty state): returns True then, so
        the reply can say so (the ``state-fallback`` metric); likewise when the accounted
        version cannot be found.
        """
        fell_back = self._restore_newest(experiment, server_round, model)
        if accounted is None or not accounted_keys:
            self._keep = 0
            return fell_back
        return self._rebase(experiment, accounted, accounted_keys, model) or fell_back

    def _rebase(self, experiment: str, accounted: int, keys: Sequence[str],
                model: Sequence[Shaped]) -> bool:
        """Replace ``keys`` by their version of round ``accounted`` (module docstring);
        True when that version is lost and the held one is used instead."""
        self._keep = accounted
        tag = self.tag()
        held = tag[1] if tag is not None and tag[0] == experiment else 0
        if held == accounted:
            base = {k: self._mem.array_records[k] for k in keys if k in self._mem.array_records}
        elif held > accounted:
            found = self._accounted_version(experiment, accounted, keys, model)
            if found is None:
                log(WARNING, "client state: the version of round %d the server accounted for "
                    "is lost; starting %s from round %d's", accounted, ", ".join(keys), held)
                return True
            base = found
        else:  # the server counted a newer reply than the state held: that version is lost
            log(WARNING, "client state: the server accounted for round %d, the newest state "
                "held is round %d's; starting %s from it", accounted, held, ", ".join(keys))
            return True
        for key in keys:
            if key in self._mem.array_records:
                del self._mem[key]
            if key in base:
                self._mem[key] = base[key]
        self._set_accounted(experiment, accounted, base)
        return False

    def _accounted_version(self, experiment: str, accounted: int, keys: Sequence[str],
                           model: Sequence[Shaped]) -> dict[str, Any] | None:
        """``keys`` as of round ``accounted`` (absent = zeros), from memory or disk."""
        if accounted == 0:
            return {}
        if ACCOUNTED_TAG in self._mem.config_records:
            meta = self._mem.config_records[ACCOUNTED_TAG]
            if (str(meta["experiment"]), int(meta["round"])) == (experiment, accounted):  # type: ignore[arg-type]
                return {k: self._mem.array_records[ACCOUNTED + k] for k in keys
                        if ACCOUNTED + k in self._mem.array_records}
        if self.disk is None:
            return None
        try:
            entries = self.disk.load_version(accounted, model)
        except StateError as err:
            log(WARNING, "%s", err)
            return None
        wrap = _Arrays if isinstance(self._mem, _PlainMemory) else ArrayRecord
        return {k: wrap([np.ascontiguousarray(a) for a in entries[k]])
                for k in keys if k in entries}

    def _set_accounted(self, experiment: str, accounted: int,
                       base: dict[str, Any]) -> None:
        """Keep ``base`` in memory as the accounted version of round ``accounted``."""
        for key in [k for k in self._mem.array_records if k.startswith(ACCOUNTED)]:
            del self._mem[key]
        for key, record in base.items():
            self._mem[ACCOUNTED + key] = record
        self._mem[ACCOUNTED_TAG] = ConfigRecord({"experiment": experiment, "round": accounted})

    def _restore_newest(self, experiment: str, server_round: int,
                        model: Sequence[Shaped]) -> bool:
        """``restore`` without the accounted keys: the newest usable version."""
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

    def save(self, experiment: str, server_round: int,
             pin: int | Collection[int] = 0) -> None:
        """Tag the state held as this round's and write it to disk, if there is one, keeping
        the versions of the rounds ``pin`` too (``rk.KEEP_ROUND``, ``rk.KEEP_ACCOUNTED``; 0:
        none)."""
        self.set_tag(experiment, server_round)
        if self.disk is not None:
            self.disk.save(server_round, self.entries(), keep=self._keep, pin=pin)
