"""Everything that bends Flower and Ray, in one place (``docs/flower_compat.md``).

Each adaptation is a small module with its table entry in ``registry.PATCHES`` (what it
replaces, why, what it measured, its guard, the processes that install it). Every guard
compares the source it relies on with the one checked against flwr ``CHECKED_FLWR``
(``guard``); a patch whose source differs declines: Flower's own behaviour, one warning.
Importing this package, or any project module, patches nothing: ``install(kind)`` does, once
per process kind.
"""

from fedinit.flower_compat.guard import CHECKED_FLWR
from fedinit.flower_compat.installer import Installed, install
from fedinit.flower_compat.registry import PATCHES, Patch

__all__ = ["CHECKED_FLWR", "PATCHES", "Installed", "Patch", "install"]
