"""The disk half of the client store: one client's versioned state files in a directory.

``<root>/<experiment>/client-<pid>-r<round>.npz``, one record per participation, the newest
``KEEP_VERSIONS`` kept: a round that was in flight when the server died is redone from the
version before it, exactly as the uninterrupted run did.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from store.files import RecordError, expect_counts, read_record, write_record

KEEP_VERSIONS = 2

Entries = dict[str, list[np.ndarray]]


class Shaped(Protocol):
    """What a state check needs of the model: each array's shape (a numpy array, or one of
    Flower's ``Array`` objects as received, so the model is not decoded just for this)."""

    @property
    def shape(self) -> tuple[int, ...]: ...
"""A client's state: model-shaped lists of arrays by name (w_prev, c_i, h_i, ...)."""


class StateError(RecordError):
    """Saved client state that cannot be used; one line naming the file and the problem."""

    what = "client state"


class StateDir:
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

    def save(self, server_round: int, entries: Entries) -> None:
        """Write this round's state atomically, then keep only the newest versions."""
        self.dir.mkdir(parents=True, exist_ok=True)
        meta = {"experiment": self.experiment, "partition-id": self.pid, "round": server_round,
                "entries": {k: len(v) for k, v in entries.items()}}
        write_record(self.dir / f"client-{self.pid}-r{server_round:06d}.npz", entries, meta)
        for _, old in self._files()[:-KEEP_VERSIONS]:
            old.unlink(missing_ok=True)

    def load_before(self, server_round: int) -> tuple[int, Entries] | None:
        """The newest saved state from a round before ``server_round``, checked; or None."""
        older = [(r, p) for r, p in self._files() if r < server_round]
        if not older:
            return None
        saved_round, path = older[-1]
        return saved_round, self._read(path)

    def load_usable_before(self, server_round: int, model: Sequence[Shaped]
                           ) -> tuple[tuple[int, Entries] | None, list[str]]:
        """The newest version before ``server_round`` that reads and fits ``model``, or None
        (start from w_0), and one line per newer version that did not.

        An unusable file is renamed to ``*.npz.damaged``: it no longer counts as a kept
        version, so one bad file cannot lock the client out, and it stays for inspection."""
        problems: list[str] = []
        for saved_round, path in reversed([(r, p) for r, p in self._files() if r < server_round]):
            try:
                entries = self._read(path)
                check_state(path, entries, model)
            except StateError as err:
                problems.append(str(err))
                path.replace(path.with_name(path.name + ".damaged"))
                continue
            return (saved_round, entries), problems
        return None, problems

    def _read(self, path: Path) -> Entries:
        """One state file's entries; StateError if it is unreadable or not this client's."""
        try:
            groups, meta = read_record(path)
            counts = meta.get("entries")
            if not isinstance(counts, dict):
                raise RecordError(path, "is incomplete: its meta lists no entries")
            expect_counts(path, groups, counts)
        except RecordError as err:
            raise StateError(path, err.problem) from None
        if meta.get("experiment") != self.experiment or meta.get("partition-id") != self.pid:
            raise StateError(path, f"belongs to experiment {meta.get('experiment')} partition "
                                   f"{meta.get('partition-id')}, not {self.experiment} "
                                   f"partition {self.pid}")
        return {k: groups.get(k, []) for k in counts}


def check_state(path: Path, entries: Entries, model: Sequence[Shaped]) -> None:
    """Saved state must match the model it will be combined with, and be finite (a NaN
    w_prev would make every later start point NaN)."""
    expected = [tuple(a.shape) for a in model]
    for key, arrays in entries.items():
        shapes = [a.shape for a in arrays]
        if len(shapes) != len(expected):
            raise StateError(path, f"entry {key!r} has {len(shapes)} arrays, the model "
                                   f"{len(expected)}")
        if shapes != expected:
            i = next(i for i, (s, e) in enumerate(zip(shapes, expected, strict=True)) if s != e)
            raise StateError(path, f"entry {key!r}[{i}] has shape {shapes[i]}, the model "
                                   f"{expected[i]}")
        if not all(np.issubdtype(a.dtype, np.floating) and np.isfinite(a).all()
                   for a in arrays):
            raise StateError(path, f"entry {key!r} is not finite floats")
