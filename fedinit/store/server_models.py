"""The server's copy of each client's latest model, one file per client and version, on disk.

FedRelax's server needs every client's newest model to build the neighbourhood terms, but
holding N models in memory does not scale (10,000 clients x a CNN), so it keeps them here and
reads only the neighbours of the clients it sends to. A version is named by the round that
wrote it; the method's checkpointed server state says which version of each client is
current, so a run resumed from round R's checkpoint reads exactly what it read then, even if
the crashed round R+1 had already written newer files. Writing version r keeps the current
version (the checkpoint may still need it) and removes any other: at most two per client.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from fedinit.store.files import RecordError, read_record, write_record


class ServerModelError(RecordError):
    what = "server copy of a client model"


class ServerModels:
    """``<root>/<client id>/r<round>.npz`` records holding one model each; ``root`` None: a
    temporary directory, removed with this object (in-process tests without a run)."""

    def __init__(self, root: Path | None) -> None:
        self._tmp = None if root is not None else tempfile.TemporaryDirectory(
            prefix="server-models-")
        self.root = root if root is not None else Path(self._tmp.name)  # type: ignore[union-attr]

    def path(self, partition_id: int, version: int) -> Path:
        return self.root / str(partition_id) / f"r{version}.npz"

    def read(self, partition_id: int, version: int) -> list[np.ndarray]:
        """Client ``partition_id``'s model as written in round ``version``."""
        path = self.path(partition_id, version)
        groups, meta = read_record(path)
        if meta.get("client") != partition_id or meta.get("round") != version:
            raise ServerModelError(path, f"holds client {meta.get('client')} round "
                                         f"{meta.get('round')}, expected {partition_id} "
                                         f"round {version}")
        return groups.get("w", [])

    def write(self, partition_id: int, version: int, model: list[np.ndarray], current: int) -> None:
        """Store ``model`` as version ``version``; keep version ``current`` (0: none), remove
        every other version of this client (left by a round that was not checkpointed)."""
        folder = self.root / str(partition_id)
        folder.mkdir(parents=True, exist_ok=True)
        write_record(self.path(partition_id, version), {"w": list(model)},
                     {"client": partition_id, "round": version})
        keep = {f"r{version}.npz", f"r{current}.npz"}
        for old in folder.glob("r*.npz"):
            if old.name not in keep:
                old.unlink(missing_ok=True)

    def disk_bytes(self) -> int:
        """Bytes of every stored version (the benchmark's disk figure)."""
        return sum(p.stat().st_size for p in self.root.glob("*/r*.npz"))
