"""Atomic files and the npz+JSON record: the two ways this project writes to disk.

Every file is written to a unique temporary name beside it, fsynced and renamed over the
target, so a reader (or a run resumed after a crash) sees the old file or the new one, never
half of one, and two processes writing the same cache do not trample each other's temp file.

A record is one ``.npz`` file: groups of arrays stored as ``<group>/<i>`` plus a ``meta`` entry
holding UTF-8 JSON. Server checkpoints and client state files are records.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import io
import json
import os
import secrets
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

META = "meta"
"""The record's entry holding its JSON metadata (as uint8 bytes)."""


class RecordError(ValueError):
    """A file that cannot be used; the message is one line naming the file and the problem.

    Subclasses set ``what`` (e.g. "client state") to say what kind of file it is.
    """

    what = ""

    def __init__(self, path: Path | str, problem: object) -> None:
        self.path = Path(path)
        self.problem = " ".join(str(problem).split())  # one line, whatever the cause said
        super().__init__(f"{self.what} {path} {self.problem}".lstrip())


def atomic_write(path: Path, write: Callable[[IO[bytes]], object],
                 mode: int | None = None, sync: bool = True) -> None:
    """Call ``write`` on a temp file beside ``path``, fsync it, then rename it over ``path``.

    The file gets the default permissions of a new file (the umask applies), or ``mode``.
    The temp file is removed if anything fails; only a killed process leaves one behind.
    ``sync=False`` skips the fsync (still atomic for readers and for a killed process): for
    files whose owner makes them durable in a batch (``sync_filesystem``) before it relies
    on them.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        with tmp.open("xb") as f:
            write(f)
            f.flush()
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old or the new file, never half."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write_bytes`` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode())


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """An uncompressed ``.npz`` of ``arrays`` in memory (entries in the dict's order)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def write_record(path: Path, arrays: dict[str, list[np.ndarray]], meta: dict[str, Any],
                 sync: bool = True) -> None:
    """Write the record atomically: ``<group>/<i>`` for each group's arrays, then ``meta``.

    A group without arrays leaves no trace in the file; a format that needs to know about
    empty groups keeps their counts in ``meta`` (see ``expect_counts``). ``sync``: as in
    ``atomic_write``.
    """
    flat = {f"{name}/{i}": a for name, group in arrays.items() for i, a in enumerate(group)}
    flat[META] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    # streamed: no second copy in memory
    atomic_write(path, lambda f: np.savez(f, **flat), sync=sync)


def read_record(path: Path) -> tuple[dict[str, list[np.ndarray]], dict[str, Any]]:
    """The groups of arrays (in file order) and the meta of one record; RecordError if the
    file is missing, unreadable, or not laid out as a record."""
    if not path.is_file():
        raise RecordError(path, "does not exist")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise RecordError(path, f"is unreadable or corrupted: {err}") from None
    if META not in data:
        raise RecordError(path, f"is incomplete: missing {META!r}")
    try:
        meta = json.loads(data.pop(META).tobytes().decode())
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise RecordError(path, f"has an unreadable {META!r}: {err}") from None
    if not isinstance(meta, dict):
        raise RecordError(path, f"has a {META!r} that is not a JSON object")
    indexed: dict[str, dict[int, np.ndarray]] = {}
    for key, array in data.items():
        name, _, index = key.rpartition("/")
        if not name or not (index.isascii() and index.isdigit()):
            raise RecordError(path, f"holds an entry {key!r} that is not <group>/<index>")
        indexed.setdefault(name, {})[int(index)] = array
    groups: dict[str, list[np.ndarray]] = {}
    for name, by_index in indexed.items():
        if sorted(by_index) != list(range(len(by_index))):
            missing = min(set(range(len(by_index) + 1)) - set(by_index))
            raise RecordError(path, f"is incomplete: missing {name}/{missing}")
        groups[name] = [by_index[i] for i in range(len(by_index))]
    return groups, meta


def expect_counts(path: Path, groups: dict[str, list[np.ndarray]],
                  counts: dict[str, Any]) -> None:
    """Check that each group named in ``counts`` holds exactly that many arrays."""
    for name, n in counts.items():
        got = len(groups.get(name, []))
        if not isinstance(n, int) or got != n:
            raise RecordError(path, f"is incomplete: {name} has {got} arrays, meta says {n}")


@functools.lru_cache(maxsize=1)
def _syncfs() -> Callable[[int], int] | None:
    """Linux's syncfs(2) from the C library, or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.syncfs  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def sync_filesystem(path: Path) -> None:
    """Make every file written on ``path``'s file system durable, in one call (syncfs(2), or
    sync(2) where it is missing): one flush for a round's client-state files written with
    ``sync=False``, instead of one fsync each. Does nothing if ``path`` does not exist."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        syncfs = _syncfs()
        if syncfs is None or syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)
