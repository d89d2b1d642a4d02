"""The disk half of the client store: one client's versioned state files in a directory.

``<root>/<experiment>/client-<cid>/r<round>.npz``, one record per participation, the newest
``KEEP_VERSIONS`` kept: a round that was in flight when the server died is redone from the
version before it, exactly as the uninterrupted run did. Under ``rounds=async`` a client may
train several times between two checkpoints, so the server also names the version a resume
would start it from (``rk.KEEP_ROUND``), kept beside the newest two.

One directory per client, so finding a client's versions lists only its own files: with every
client's files in one directory (the layout before, ``<experiment>/client-<cid>-r<round>.npz``)
each participation listed the whole federation's files, which grows with the number of
clients. Files in that layout are still read: a client moves its own into its directory the
first time it looks (one rename each, atomic), so a run started before resumes unchanged.

The experiment id comes from the server: it must be one plain name (``fedinit.store.path_names``),
and every path is resolved before it is read, written, renamed or deleted: nothing outside
``<root>`` is touched, a symbolic link that leads out included (``PathError``, not StateError:
the task is refused, no file is set aside as damaged).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from fedinit.store.files import RecordError, expect_counts, read_record, write_record
from fedinit.store.path_names import inside, path_name

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


VERSION_NAME = re.compile(r"r(\d+)\.npz")
"""A version's file name in a client's directory."""
FLAT_NAME = re.compile(r"client-(\d+)-r(\d+)\.npz")
"""A version's file name in the layout before (every client's files in the experiment's)."""

_no_flat_files: set[Path] = set()
"""Experiment directories this process found without files of the layout before. No code
writes that layout any more, so one look per directory and process is enough."""


class StateDir:
    """One client's state files: ``<root>/<experiment>/client-<cid>/r<round>.npz``."""

    def __init__(self, root: Path, experiment: str, partition_id: int,
                 sync: bool = True) -> None:
        """``sync=False``: versions are written without their own fsync; the writer's owner
        makes them durable in a batch (a simulation's server,
        ``fedinit.store.files.sync_filesystem``,
        before each checkpoint). PathError when ``experiment`` is not one plain name."""
        path_name(experiment, "experiment-id")
        if isinstance(partition_id, bool) or not isinstance(partition_id, int) \
                or partition_id < 0:
            raise ValueError(f"partition id {partition_id!r} is not allowed; allowed: an "
                             "integer >= 0")
        self.root = root
        self.dir = root / experiment
        self.sync = sync
        self.client_dir = self.dir / f"client-{partition_id}"
        self.experiment = experiment
        self.cid = partition_id
        self._moved_flat = False

    def version_path(self, server_round: int) -> Path:
        """Where this client's state of ``server_round`` is (or would be) kept."""
        return self.client_dir / f"r{server_round:06d}.npz"

    def inside(self, path: Path) -> Path:
        """``path`` when it resolves inside the root; PathError otherwise."""
        return inside(self.root, path, "client state path")

    def check(self) -> None:
        """Refuse (PathError) before any work when this client's directories or any entry
        in its own directory lead outside the root."""
        self.inside(self.dir)
        self.inside(self.client_dir)
        try:
            names = os.listdir(self.client_dir)
        except (FileNotFoundError, NotADirectoryError):
            return
        for name in names:
            self.inside(self.client_dir / name)

    def _files(self) -> list[tuple[int, Path]]:
        """This client's versions, oldest first (each checked to lie inside the root)."""
        self._move_flat_files()
        try:
            names = os.listdir(self.inside(self.client_dir))
        except FileNotFoundError:
            return []
        return sorted((int(m.group(1)), self.inside(self.client_dir / name)) for name in names
                      if (m := VERSION_NAME.fullmatch(name)))

    def _move_flat_files(self) -> None:
        """Move this client's files of the layout before into its directory (once)."""
        if self._moved_flat or self.dir in _no_flat_files:
            return
        try:
            names = os.listdir(self.inside(self.dir))
        except FileNotFoundError:
            names = []
        flat = [m for name in names if (m := FLAT_NAME.fullmatch(name))]
        for m in flat:
            if int(m.group(1)) != self.cid:
                continue
            self.inside(self.client_dir).mkdir(parents=True, exist_ok=True)
            source = self.inside(self.dir / m.group(0))
            target = self.inside(self.version_path(int(m.group(2))))
            if target.exists():  # the same round in both layouts: the directory's is newer
                source.unlink(missing_ok=True)
            else:
                os.replace(source, target)
        if not flat:
            _no_flat_files.add(self.dir)
        self._moved_flat = True

    def save(self, server_round: int, entries: Entries, keep: int = 0,
             pin: int | Collection[int] = 0) -> None:
        """Write this round's state atomically, then keep only the newest versions, the
        version of round ``keep`` (the one the server accounted for; 0: none) and those of
        the rounds ``pin`` (the ones an asynchronous server may ask for again after a resume:
        the state its task in flight started from, the state it last accounted)."""
        pins = {pin} if isinstance(pin, int) else set(pin)
        self._move_flat_files()
        self.inside(self.client_dir).mkdir(parents=True, exist_ok=True)
        meta = {"experiment": self.experiment, "partition-id": self.cid, "round": server_round,
                "entries": {k: len(v) for k, v in entries.items()}}
        write_record(self.inside(self.version_path(server_round)), entries, meta,
                     sync=self.sync)
        for saved_round, old in self._files()[:-KEEP_VERSIONS]:
            if saved_round != keep and saved_round not in pins:
                old.unlink(missing_ok=True)

    def load_version(self, server_round: int, model: Sequence[Shaped]) -> Entries:
        """The state saved in ``server_round`` exactly, checked against ``model``;
        StateError when it is missing or unusable (left in place: it is not the newest)."""
        path = self.inside(self.version_path(server_round))
        if not path.exists():
            raise StateError(path, "is missing")
        entries = self._read(path)
        check_state(path, entries, model)
        return entries

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
        self.inside(path)
        try:
            groups, meta = read_record(path)
            counts = meta.get("entries")
            if not isinstance(counts, dict):
                raise RecordError(path, "is incomplete: its meta lists no entries")
            expect_counts(path, groups, counts)
        except RecordError as err:
            raise StateError(path, err.problem) from None
        if meta.get("experiment") != self.experiment or meta.get("partition-id") != self.cid:
            raise StateError(path, f"belongs to experiment {meta.get('experiment')} partition "
                                   f"{meta.get('partition-id')}, not {self.experiment} "
                                   f"partition {self.cid}")
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
