"""Numbers in a refusal, printed so the comparison the line states reads as true as it is.

``f"{0.9999999:g} < {1.0:g}"`` prints ``1 < 1``: a refusal that reads false. ``shown`` prints
values at the fewest significant digits (``:g``'s six, or a given least) at which every two
that differ also read differently; rounding keeps the order, so ``a < b`` reads ``a < b``.
"""

from __future__ import annotations

MIN_DIGITS = 6
MAX_DIGITS = 17
"""Seventeen significant digits tell any two distinct floats apart."""


def shown(*values: float, least: int = MIN_DIGITS) -> tuple[str, ...]:
    """Each of ``values`` at one common precision, ``least`` significant digits or as many
    more as keep distinct values apart."""
    for digits in range(least, MAX_DIGITS + 1):
        texts = tuple(f"{v:.{digits}g}" for v in values)
        if all((texts[i] == texts[j]) == (values[i] == values[j])
               for i in range(len(values)) for j in range(i)):
            return texts
    return tuple(repr(v) for v in values)  # not reached for floats: 17 digits tell them apart
