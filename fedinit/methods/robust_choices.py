"""The ``aggregation`` choices and what each needs, without Flower: the run config checks
them before any work and must not load Flower (``fedinit.methods.robust`` does the math)."""

from __future__ import annotations

SELECTIONS: tuple[str, ...] = ("krum", "multi-krum", "bulyan")
"""The choices that select whole replies before combining."""
AGGREGATIONS: tuple[str, ...] = ("mean", "median", "trimmed-mean", *SELECTIONS)
"""Every ``aggregation`` choice."""


def min_replies(kind: str, f: int) -> int:
    """The fewest replies the rule is defined for with f attackers: Krum and Multi-Krum
    n > 2f + 2, Bulyan n >= 4f + 3; 1 for the coordinate-wise rules."""
    if kind in ("krum", "multi-krum"):
        return 2 * f + 3
    if kind == "bulyan":
        return 4 * f + 3
    return 1
