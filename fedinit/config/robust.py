"""Robustness: the server's defences against bad replies (robust rules, the norm filter, the
cap on a reply's claimed examples)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from fedinit.config.errors import bad_value


@dataclass(frozen=True)
class RobustConfig:
    """``aggregation`` .. ``max-examples-per-client``, typed (names: keys with '-' -> '_')."""

    aggregation: str
    trim_fraction: float
    byzantine_f: int
    max_update_norm_ratio: float
    max_examples_per_client: int


def check_trim_fraction(r: RobustConfig) -> None:
    """A trimmed mean drops less than half from each side."""
    if not 0.0 <= r.trim_fraction < 0.5:
        raise bad_value("trim-fraction", r.trim_fraction, "0 <= trim-fraction < 0.5")


def check_byzantine_f(r: RobustConfig) -> None:
    """``byzantine-f`` on its own; against the round size in ``cross.check_robust``."""
    if r.byzantine_f < 0:
        raise bad_value("byzantine-f", r.byzantine_f, "an integer >= 0")


def check_norm_ratio(r: RobustConfig) -> None:
    """The norm filter's ratio: finite (NaN would turn the filter off), 0 disables it."""
    if not 0.0 <= r.max_update_norm_ratio < math.inf:
        raise bad_value("max-update-norm-ratio", r.max_update_norm_ratio,
                        "a finite number >= 0 (0 disables the norm filter)")
