"""The protocol's parameters: threshold, graph degree, clipping bound, quantisation bits.

Quantisation (Flower's ``quantize``) maps [-c, c] onto the integers 0..2^bits with stochastic
rounding, so each client's coordinate is off by less than one step 2c/2^bits and a sum of n
uploads by less than n steps. The field is the integers modulo 2^f, f = ``field_bits`` (8, 16
or 32): a masked coordinate travels as f/8 bytes, and the sum of n quantised values cannot
wrap while n * 2^bits < 2^f, which is the client cap. The server picks the narrowest field
for the round's sampled clients (``narrowest_field``), so the bytes on the wire follow the
quantisation: 8-bit values of up to 255 clients travel in 2 bytes, not 4. The masks are drawn
modulo 2^32 (``masks.expand``); 2^f divides 2^32, so reduced modulo 2^f they are still
uniform and still cancel.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedinit.secure_aggregation.wire import SecAggInputError

MOD_BITS = 32
MODULUS = 1 << MOD_BITS
"""The widest field, the masks' own range."""
FIELD_BITS = (8, 16, MOD_BITS)
"""The field widths a masked coordinate may travel in: whole little-endian unsigned ints."""
MAX_BITS = 24  # Flower's stochastic rounding casts to int32; 2^24 levels leave room for 255 clients


def narrowest_field(bits: int, clients: int) -> int:
    """The narrowest of ``FIELD_BITS`` in which the sum of ``clients`` values of 0..2^bits
    cannot wrap (``clients`` * 2^bits < 2^f); the widest when none is narrower."""
    return next((f for f in FIELD_BITS if clients * (1 << bits) < 1 << f), MOD_BITS)


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
    field_bits: int = MOD_BITS
    """f: the field is the integers modulo 2^f; one of ``FIELD_BITS``, above ``bits``."""

    def __post_init__(self) -> None:
        for name in ("threshold", "num_shares", "bits", "field_bits"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise SecAggInputError(f"secagg {name} must be an int, got {value!r}")
        if not 1 <= self.bits <= MAX_BITS:
            raise SecAggInputError(f"secagg bits must be in 1..{MAX_BITS}, got {self.bits}")
        if self.field_bits not in FIELD_BITS or self.field_bits <= self.bits:
            raise SecAggInputError(
                f"secagg field-bits must be one of {', '.join(map(str, FIELD_BITS))} and above "
                f"bits={self.bits}, got {self.field_bits}")
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
    def modulus(self) -> int:
        """2^f: the field's size."""
        return 1 << self.field_bits

    @property
    def value_dtype(self) -> str:
        """A masked coordinate on the wire: a little-endian unsigned int of f/8 bytes."""
        return f"<u{self.field_bits // 8}"

    @property
    def max_clients(self) -> int:
        """The most uploads whose quantised sum cannot wrap around the modulus."""
        return (self.modulus - 1) // self.target_range

    def sum_error_bound(self, n: int) -> float:
        """Per-coordinate bound on |dequantised sum - sum of clipped inputs| for n uploads."""
        return n * self.step

    def to_config(self) -> dict[str, Any]:
        """The parameters as ConfigRecord values (the setup message carries them)."""
        return {"threshold": self.threshold, "num-shares": self.num_shares,
                "clip": float(self.clip), "bits": self.bits, "field-bits": self.field_bits}

    @classmethod
    def from_config(cls, msg: Mapping[str, Any]) -> SecAggParams:
        """Parse (and so validate) the parameters a setup message carries."""
        missing = [k for k in ("threshold", "num-shares", "clip", "bits", "field-bits")
                   if k not in msg]
        if missing:
            raise SecAggInputError(f"secagg setup lacks {', '.join(missing)}")
        return cls(threshold=msg["threshold"], num_shares=msg["num-shares"],
                   clip=msg["clip"], bits=msg["bits"], field_bits=msg["field-bits"])
