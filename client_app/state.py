"""Per-client state kept between participations: in memory and, optionally, on disk.

``ClientState`` wraps Flower's ``context.state`` (persisted per node and run: in the
simulation process, or in the SuperNode's memory in a deployment). Each entry is a
model-shaped list of arrays (w_prev, c_i, h_i, ...), tagged with the round that produced it.

``StateMirror`` copies the state to a directory after every participation, so a SuperNode
that restarts, or a run resumed from a server checkpoint, continues from it. It keeps the
last two versions: a round that was in flight when the server died is redone from the
version before it, exactly as the uninterrupted run did.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

W_PREV = "w_prev"
"""RI: the client's final local model of its last participation (w_0 before the first)."""
META = "client-meta"
KEEP_VERSIONS = 2


class StateError(ValueError):
    """Saved client state that cannot be used; one line naming the file and the problem."""


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

    def entries(self) -> dict[str, list[np.ndarray]]:
        return {k: v.to_numpy_ndarrays() for k, v in self._store.array_records.items()}

    def replace(self, entries: dict[str, list[np.ndarray]]) -> None:
        """Drop every stored array entry and store ``entries`` instead."""
        for key in list(self._store.array_records):
            del self._store[key]
        for key, arrays in entries.items():
            self.put(key, arrays)

    def tag(self) -> tuple[str, int] | None:
        """(experiment id, round) of the stored state, if any."""
        if META not in self._store.config_records:
            return None
        meta = self._store.config_records[META]
        return str(meta["experiment"]), int(meta["round"])  # type: ignore[arg-type]

    def set_tag(self, experiment: str, server_round: int) -> None:
        self._store[META] = ConfigRecord({"experiment": experiment, "round": server_round})


class StateMirror:
    """One client's state files: ``<root>/<experiment>/client-<pid>-r<round>.npz``."""

    def __init__(self, root: Path, experiment: str, partition_id: int) -> None:
        self.dir = root / experiment
        self.experiment = experiment
        self.pid = partition_id

    def _files(self) -> list[tuple[int, Path]]:
        prefix = f"client-{self.pid}-r"
        found = []
        if self.dir.is_dir():
            for path in self.dir.glob(f"{prefix}*.npz"):
                digits = path.stem[len(prefix):]
                if digits.isdigit():
                    found.append((int(digits), path))
        return sorted(found)

    def save(self, server_round: int, entries: dict[str, list[np.ndarray]]) -> None:
        """Write this round's state atomically, then keep only the newest versions."""
        self.dir.mkdir(parents=True, exist_ok=True)
        arrays = {f"{k}/{i}": a for k, v in entries.items() for i, a in enumerate(v)}
        meta = {"experiment": self.experiment, "partition-id": self.pid, "round": server_round,
                "entries": {k: len(v) for k, v in entries.items()}}
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        path = self.dir / f"client-{self.pid}-r{server_round:06d}.npz"
        tmp = path.with_name(f".{path.name}.tmp")
        with tmp.open("wb") as f:
            f.write(buf.getvalue())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        for _, old in self._files()[:-KEEP_VERSIONS]:
            old.unlink(missing_ok=True)

    def load_before(self, server_round: int) -> tuple[int, dict[str, list[np.ndarray]]] | None:
        """The newest saved state from a round before ``server_round``, checked; or None."""
        older = [(r, p) for r, p in self._files() if r < server_round]
        if not older:
            return None
        saved_round, path = older[-1]
        return saved_round, self._read(path)

    def load_usable_before(
        self, server_round: int, model: list[np.ndarray]
    ) -> tuple[tuple[int, dict[str, list[np.ndarray]]] | None, list[str]]:
        """The newest version before ``server_round`` that reads and fits ``model``, or None
        (start from w_0), and one line per newer version that did not.

        An unusable file is renamed to ``*.npz.damaged``: it no longer counts as a kept
        version, so one bad file cannot lock the client out, and it stays for inspection."""
        problems: list[str] = []
        for saved_round, path in reversed([(r, p) for r, p in self._files() if r < server_round]):
            try:
                entries = self._read(path)
                check_shapes(entries, model, str(path))
            except StateError as err:
                problems.append(str(err))
                path.replace(path.with_name(path.name + ".damaged"))
                continue
            return (saved_round, entries), problems
        return None, problems

    def _read(self, path: Path) -> dict[str, list[np.ndarray]]:
        """One state file's entries; StateError if it is unreadable or not this client's."""
        try:
            with np.load(path, allow_pickle=False) as z:
                data = {k: z[k] for k in z.files}
            meta = json.loads(data.pop("meta").tobytes().decode())
            entries = {k: [data[f"{k}/{i}"] for i in range(n)]
                       for k, n in meta["entries"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile,
                EOFError) as err:
            raise StateError(f"client state {path} is unreadable: {err}") from None
        if meta.get("experiment") != self.experiment or meta.get("partition-id") != self.pid:
            raise StateError(f"client state {path} belongs to experiment "
                             f"{meta.get('experiment')} partition {meta.get('partition-id')}, "
                             f"not {self.experiment} partition {self.pid}")
        return entries


def check_shapes(entries: dict[str, list[np.ndarray]], model: list[np.ndarray],
                 where: str) -> None:
    """Saved state must match the model it will be combined with, and be finite (a NaN
    w_prev would make every later start point NaN)."""
    for key, arrays in entries.items():
        shapes = [a.shape for a in arrays]
        expected = [a.shape for a in model]
        if shapes != expected:
            raise StateError(f"client state {key!r} from {where} has shapes that do not match "
                             f"the model ({len(shapes)} arrays vs {len(expected)})")
        if not all(np.issubdtype(a.dtype, np.floating) and np.isfinite(a).all()
                   for a in arrays):
            raise StateError(f"client state {key!r} from {where} is not finite floats")
