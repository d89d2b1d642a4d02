"""The device's own list of the apps it may run: a run's FAB is code, and whoever reaches the
SuperLink's Control API (or controls the SuperLink) can submit one.

The list is a text file on the device, one approved FAB hash a line (the SHA-256 of the FAB
bytes, as Flower computes it: ``hashlib.sha256(fab_bytes).hexdigest()``), each optionally
followed by a ``#`` comment; blank and ``#`` lines are skipped::

    # approved apps of this device (python -m fedinit.node.approve_app <app dir or .fab>)
    3f1c...e9a0  # fedinit 1.0.0, approved 2026-12-02

Where the device reads it (``path_from_node_config``): the node config's ``approved-apps``
key (the file must exist), else ``<state-dir>/approved-apps.txt`` when it exists; neither:
no list, every app runs (Flower's behaviour). The file is read again at every check, so an
approval (a line appended) takes effect at the next run without a restart; a file that can
no longer be read refuses every app (fail closed) with its one-line error.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KEY = "approved-apps"
"""The node config key naming the file."""
DEFAULT_FILE = "approved-apps.txt"
"""The file read from the node config's ``state-dir`` when ``approved-apps`` is not set."""
PREFIX = "app allowlist: "
HASH = re.compile(r"[0-9a-f]{64}")


class AllowlistError(ValueError):
    """The device's list cannot be used (one line naming the file, line and what is allowed)."""


def fab_hash(content: bytes) -> str:
    """The FAB's hash as Flower computes it (``flwr/cli/run``, ``flwr/cli/build``)."""
    return hashlib.sha256(content).hexdigest()


def parse(text: str, where: str) -> frozenset[str]:
    """The approved hashes in ``text`` (the file's content); AllowlistError on a bad line."""
    hashes = set()
    for number, raw in enumerate(text.splitlines(), 1):
        entry = raw.split("#", 1)[0].strip()
        if not entry:
            continue
        if not HASH.fullmatch(entry):
            shown = entry if len(entry) <= 80 else entry[:77] + "..."
            raise AllowlistError(f"{where}:{number}: {shown!r} is not an app hash; allowed: "
                                 "64 lowercase hex digits (the FAB's SHA-256, python -m "
                                 "fedinit.node.approve_app), an optional # comment, or a "
                                 "blank line")
        hashes.add(entry)
    return frozenset(hashes)


def read(path: Path) -> frozenset[str]:
    """The approved hashes of the file at ``path``; AllowlistError when it cannot be read."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise AllowlistError(f"{path} cannot be read as the device's approved apps: "
                             f"{type(err).__name__}: {' '.join(str(err).split())}") from None
    return parse(text, str(path))


def path_from_node_config(node_config: Mapping[str, Any]) -> Path | None:
    """The device's list: ``approved-apps`` (must be a file), else ``<state-dir>/approved-
    apps.txt`` if present, else None (no list)."""
    named = node_config.get(KEY)
    if named is not None:
        if not isinstance(named, str) or not named:
            raise AllowlistError(f"{KEY}={named!r} is not allowed; allowed: the path of the "
                                 "device's approved-apps file")
        path = Path(named).expanduser()
        if not path.is_file():
            raise AllowlistError(f"{KEY}={named!r} is not a file; allowed: the path of the "
                                 "device's approved-apps file (python -m fedinit.node.approve_app "
                                 "--append creates it)")
        return path
    state_dir = node_config.get("state-dir")
    if isinstance(state_dir, str) and state_dir and (Path(state_dir) / DEFAULT_FILE).is_file():
        return Path(state_dir) / DEFAULT_FILE
    return None


@dataclass(frozen=True)
class Allowlist:
    """The device's approved apps, read from ``path`` at each check."""

    path: Path

    @classmethod
    def load(cls, path: Path) -> Allowlist:
        """The list at ``path``, read once now so that a bad file stops the node at start."""
        read(path)
        return cls(path)

    def refusal(self, claimed_hash: str, run_id: int | str,
                content: bytes | None = None) -> str | None:
        """Why this device refuses run ``run_id`` of FAB ``claimed_hash`` (one line), or None.

        With ``content`` (the FAB's bytes) its own hash is what is checked, and it must be the
        claimed one: a SuperLink may name an approved hash and send other code."""
        try:
            approved = read(self.path)
        except AllowlistError as err:
            return f"{PREFIX}refused run {run_id}: {err} (every app is refused until it is fixed)"
        if content is not None:
            actual = fab_hash(content)
            if actual != claimed_hash:
                return (f"{PREFIX}refused run {run_id}: its FAB's SHA-256 is {actual}, not the "
                        f"FAB hash {claimed_hash or '(none)'} it was sent as")
        if claimed_hash not in approved:
            return (f"{PREFIX}refused run {run_id}: FAB {claimed_hash or '(none)'} is not in "
                    f"{self.path} (this device's approved apps; approve a new version with "
                    "python -m fedinit.node.approve_app)")
        return None
