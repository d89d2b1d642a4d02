"""Names a server sends that become part of a path on a device, and where such paths may lead.

A device's disk layout is the device's: a value from a message or a run config (an
experiment id, a run name) may name at most one plain entry inside a directory the device
chose, never a place of its own. ``path_name`` accepts one path component from a small
alphabet (``+`` too: a run name holds ``1e+06`` for a Dirichlet alpha of a million);
``inside`` resolves a path (symbolic links included) and accepts it only within
its root, so a link inside the device's state directory that points out is never followed
for reading, writing or deleting. Both refuse with one line naming the value and what is
allowed.
"""

from __future__ import annotations

import re
from pathlib import Path

MAX_LENGTH = 128
NAME = re.compile(r"[A-Za-z0-9._+-]+")
ALLOWED = (f"one plain name of 1 to {MAX_LENGTH} characters from A-Z a-z 0-9 . _ - +, "
           "not '.' or '..'")


class PathError(ValueError):
    """A server-sent name, or a path built from one, that would leave the device's own
    directory (one line): the task is refused, nothing is read, written or deleted."""


def path_name(value: object, what: str) -> str:
    """``value`` when it is one plain path component (``ALLOWED``); PathError otherwise."""
    if (not isinstance(value, str) or not 0 < len(value) <= MAX_LENGTH
            or value in (".", "..") or not NAME.fullmatch(value)):
        shown = repr(value) if len(repr(value)) <= 2 * MAX_LENGTH else \
            f"{repr(value)[:2 * MAX_LENGTH]}... ({len(str(value))} characters)"
        raise PathError(f"{what}={shown} is not allowed; allowed: {ALLOWED}")
    return value


def inside(root: Path, path: Path, what: str) -> Path:
    """``path`` when it resolves (following every link) to ``root`` or below; PathError
    naming it relative to ``root`` (the device's own paths stay off the reply) otherwise."""
    try:
        escapes = not path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a link loop: it leads nowhere inside
        escapes = True
    if escapes:
        try:
            shown = path.relative_to(root).as_posix()
        except ValueError:
            shown = path.name
        raise PathError(f"{what} {shown!r} resolves outside this device's state directory; "
                        "allowed: only files inside it (a symbolic link out of it is never "
                        "followed)")
    return path
