"""The guard of Flower's private helpers that the project's robust aggregation reuses.

``fedinit/methods/robust.py`` computes the trimmed mean, Multi-Krum's selection and Bulyan's
closest values with Flower's own functions, so its results are Flower's; it imports them
itself (the math imports no patch layer). They are not Flower's public API, so the engine
checks their source once per process when it builds a robust rule
(``strategies/round_stages/combine.py``: ``RobustMean``): if it is not the one checked (table
entry ``flower-helpers``), one warning, and the run goes on with Flower's function as it is
now (there is no other behaviour to fall back to: these are Flower's own).
"""

from __future__ import annotations

from fedinit.flower_compat.guard import allowed

NAME = "flower-helpers"


def check() -> bool:
    """Whether Flower's helpers are the source checked (False: warned once, used as they are)."""
    return allowed(NAME)
