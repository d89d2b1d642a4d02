"""The protocol's parameters: threshold, graph degree, clipping bound, quantisation bits.

The modulus is fixed at 2^32 so a masked coordinate travels as 4 bytes (a float32's size).
Quantisation (Flower's ``quantize``) maps [-c, c] onto the integers 0..2^bits with stochastic
rounding, so each client's coordinate is off by less than one step 2c/2^bits and a sum of n
uploads by less than n steps; the sum of n quantised values stays below 2^32 while
n * 2^bits < 2^32, which is the client cap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedinit.secure_aggregation.wire import SecAggInputError

MOD_BITS = 32
MODULUS = 1 << MOD_BITS
MAX_BITS = 24  # Flower's stochastic rounding casts to int32; 2^24 levels leave room for 255 clients


@dataclass(frozen=True)
class SecAggParams:
    """t of each client's k neighbours (itself included) rebuild its secrets.

    t > k/2 is enforced (by the client too): then no server, even one that tells different
    neighbours different stories, can collect t shares of both a client's self-mask seed and
    its mask key, which together would unmask its single upload.
    """

    threshold: int
    num_shares: int
    clip: float
    bits: int = 16

    def __post_init__(self) -> None:
        for name in ("threshold", "num_shares", "bits"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise SecAggInputError(f"secagg {name} must be an int, got {value!r}")
        if not 1 <= self.bits <= MAX_BITS:
            raise SecAggInputError(f"secagg bits must be in 1..{MAX_BITS}, got {self.bits}")
        if (not isinstance(self.clip, (int, float)) or isinstance(self.clip, bool)
                or not math.isfinite(self.clip) or self.clip <= 0):
            raise SecAggInputError(f"secagg clip must be a finite number > 0, got {self.clip!r}")
        if self.num_shares < 3 or self.num_shares % 2 == 0:
            raise SecAggInputError(
                f"secagg num-shares must be odd and >= 3 (itself plus (k-1)/2 ring neighbours "
                f"each side), got {self.num_shares}")
        if not self.num_shares // 2 < self.threshold <= self.num_shares:
            raise SecAggInputError(
                f"secagg threshold must be in {self.num_shares // 2 + 1}..{self.num_shares} "
                f"(more than half of num-shares={self.num_shares}), got {self.threshold}")

    @property
    def target_range(self) -> int:
        """Quantisation levels 0..target_range over [-clip, clip]."""
        return 1 << self.bits

    @property
    def step(self) -> float:
        """One quantisation step: 2 clip / 2^bits."""
        return 2.0 * self.clip / self.target_range

    @property
    def max_dropouts(self) -> int:
        """Neighbours of one client that may drop after key sharing: k - t."""
        return self.num_shares - self.threshold

    @property
    def max_clients(self) -> int:
        """The most uploads whose quantised sum cannot wrap around the modulus."""
        return (MODULUS - 1) // self.target_range

    def sum_error_bound(self, n: int) -> float:
        """Per-coordinate bound on |dequantised sum - sum of clipped inputs| for n uploads."""
        return n * self.step

    def to_config(self) -> dict[str, Any]:
        """The parameters as ConfigRecord values (the setup message carries them)."""
        return {"threshold": self.threshold, "num-shares": self.num_shares,
                "clip": float(self.clip), "bits": self.bits}

    @classmethod
    def from_config(cls, msg: Mapping[str, Any]) -> SecAggParams:
        """Parse (and so validate) the parameters a setup message carries."""
        missing = [k for k in ("threshold", "num-shares", "clip", "bits") if k not in msg]
        if missing:
            raise SecAggInputError(f"secagg setup lacks {', '.join(missing)}")
        return cls(threshold=msg["threshold"], num_shares=msg["num-shares"],
                   clip=msg["clip"], bits=msg["bits"])
