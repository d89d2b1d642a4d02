"""Everything that bends Flower and Ray, in one place (``docs/flower_compat.md``).

Each adaptation is a small module with its table entry in ``registry.PATCHES`` (what it
replaces, why, what it measured, its guard, the processes that install it). Every guard
compares the source it relies on with the one checked against flwr ``CHECKED_FLWR``
(``guard``); a patch whose source differs declines: Flower's own behaviour, one warning.
Importing this package, or any project module, patches nothing: ``install(kind)`` does, once
per process kind. The names below load on first use, so a module that needs one adaptation
(the strategies' ``grid_view``) does not load the installer and the table.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedinit.flower_compat.guard import CHECKED_FLWR
    from fedinit.flower_compat.installer import Installed, install
    from fedinit.flower_compat.registry import PATCHES, Patch

HOME = {"CHECKED_FLWR": "guard", "Installed": "installer", "install": "installer",
        "PATCHES": "registry", "Patch": "registry"}
"""Name -> the module of this package that holds it."""


def __getattr__(name: str) -> Any:
    if name in HOME:
        return getattr(importlib.import_module(f"{__name__}.{HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CHECKED_FLWR", "PATCHES", "Installed", "Patch", "install"]
