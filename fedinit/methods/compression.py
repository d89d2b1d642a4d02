"""Compressed uploads: unbiased stochastic quantisation and top-k with error feedback.

A device's uplink (0.5-5 Mbit/s) carries a float32 model move slowly; the move need not be
exact, only unbiased or, for top-k, eventually complete. ``compression`` names the codec:

- ``qB`` (B = 8, 4, 2 or 1) or ``qB/N``: each coordinate x of a block of N values (no ``/N``: the
  whole tensor) with scale s = max |x| over the block is sent as an integer code c in
  0..L, L = 2^B - 1, drawn so that E[c] = u = (x / s + 1) / 2 * L: c = floor(u) + Bernoulli
  (u - floor(u)). The decode (2 c / L - 1) s is then an unbiased estimate of x (Alistarh et
  al. 2017, QSGD's stochastic rounding, here on a [-s, s] grid). Narrower codes go 8 / B
  to a byte, the first in the lowest bits. Bytes: B/8 per coordinate plus 4 per block.
- ``topk:F`` (0 < F <= 1): per tensor the k = ceil(F n) largest |v| of v = x + e are sent
  (their indices, ascending, as uint16 in a tensor of at most 65,536 values, else int32, and
  their values), where e is the device's residual:
  what earlier rounds meant to send and did not (error feedback, Seide et al. 2014; Stich et
  al. 2018). The new residual is v minus what was sent, so residual + sent = meant, every
  round; the device keeps it like w_prev (``RESIDUAL`` state).
- ``topk:F:M`` (M >= 1): at least M values of each tensor (all of a tensor of at most M),
  so that a small tensor (a bias, the first convolution) is not starved: DGC (Lin et al.
  2018) leaves biases uncompressed and sparsifies only weight matrices; here every tensor is
  sparsified to k = min(n, max(M, ceil(F n))). ``topk:F`` is ``topk:F:1``.
- ``topk:F[:M]+qB[/N]``: top-k, its values quantised as above (the residual takes the
  quantisation error too).
- ``topk:F[:M]+ef[+qB[/N]]``: top-k whose indices go Elias-Fano coded
  (``fedinit.methods.elias_fano``: about 2 + log2(n / k) bits an index, against 16), so the
  same bytes carry more coordinates; lossless, so what the server decodes is the same.

Pure numpy: the caller draws the randomness (a seeded ``numpy.random.Generator``) and moves
the wire arrays (``fedinit.methods.packed_arrays``). ``decode`` is the server's: a client's arrays
are its word, so every count, dtype, index and scale is checked and a bad one refused in
one line (``CompressionError``) before any value is used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedinit.methods.weights import Weights

BITS = (8, 4, 2, 1)
"""Code widths a quantiser may use (1: the sign with the block's scale, stochastically
rounded). Under top-k the residual keeps what the rounding lost: at the default experiment
``topk:0.08:80+ef+q2`` trained best at 50x, ``q1`` diverged on every seed
(docs/benchmarks.md, Compressed uploads)."""
NARROW_INDEX = 1 << 16
"""A tensor of at most this many values sends its top-k indices as uint16 (else int32)."""
RESIDUAL = "residual"
"""The state key prefix of a device's top-k residual (one per upload channel)."""
_Q = re.compile(r"q(\d+)(?:/(\d+))?")
_TOPK = re.compile(r"topk:([0-9.eE+-]+)(?::(\d+))?")
ELIAS_FANO = "ef"
"""The ``compression`` part that codes top-k's indices Elias-Fano (after ``topk:F[:M]``)."""
ALLOWED = ("off | qB (B = 8, 4, 2, 1) | qB/N (blocks of N) | topk:F (0 < F <= 1) | "
           "topk:F:M (at least M values per tensor, M >= 1) | topk:F[:M]+qB[/N] | "
           "topk:F[:M]+ef[+qB[/N]] (Elias-Fano coded indices)")


class CompressionError(ValueError):
    """A compression setting or an encoded upload that cannot be used; one line."""


@dataclass(frozen=True)
class Quantiser:
    """Stochastic quantisation to ``bits`` per value with one scale per ``block`` values
    (0: one per tensor)."""

    bits: int
    block: int = 0

    @property
    def levels(self) -> int:
        return (1 << self.bits) - 1

    def _blocks(self, n: int) -> int:
        return 1 if self.block == 0 or n == 0 else -(-n // self.block)

    def _scales_of(self, x: np.ndarray) -> np.ndarray:
        """max |x| per block, float32 (a tensor of n values: ``_blocks(n)`` scales)."""
        n = x.size
        if n == 0:
            return np.zeros(1, np.float32)
        size = n if self.block == 0 else self.block
        pad = self._blocks(n) * size - n
        a = np.abs(np.concatenate([x, np.zeros(pad, x.dtype)])).reshape(-1, size)
        return a.max(axis=1).astype(np.float32)

    def _per_value(self, scales: np.ndarray, n: int) -> np.ndarray:
        size = n if self.block == 0 else self.block
        return np.repeat(scales.astype(np.float64), size)[:n]

    def encode(self, x: np.ndarray, rng: np.random.Generator) -> tuple[list[np.ndarray],
                                                                         np.ndarray]:
        """(wire arrays [codes uint8, scales float32], the decoded values) of flat ``x``."""
        flat = np.asarray(x, np.float64).ravel()
        scales = self._scales_of(flat)
        s = self._per_value(scales, flat.size)
        safe = np.where(s > 0, s, 1.0)
        u = np.clip((flat / safe + 1.0) / 2.0 * self.levels, 0.0, self.levels)
        low = np.floor(u)
        codes = (low + (rng.random(flat.size) < (u - low))).astype(np.uint8)
        decoded = self._decode_codes(codes, scales, flat.size)
        return [self._pack(codes), scales], decoded

    def _pack(self, codes: np.ndarray) -> np.ndarray:
        """8 / B codes a byte, the first in the lowest bits."""
        if self.bits == 8:
            return codes
        per = 8 // self.bits
        padded = np.concatenate([codes, np.zeros(-codes.size % per, np.uint8)])
        shifts = np.arange(per, dtype=np.uint8) * self.bits
        return np.bitwise_or.reduce(padded.reshape(-1, per) << shifts, axis=1).astype(np.uint8)

    def _unpack(self, packed: np.ndarray, n: int) -> np.ndarray:
        if self.bits == 8:
            return packed
        per = 8 // self.bits
        shifts = np.arange(per, dtype=np.uint8) * self.bits
        return ((packed[:, None] >> shifts) & self.levels).astype(np.uint8).ravel()[:n]

    def code_bytes(self, n: int) -> int:
        return -(-n * self.bits // 8)

    def _decode_codes(self, codes: np.ndarray, scales: np.ndarray, n: int) -> np.ndarray:
        s = self._per_value(scales, n)
        return ((2.0 * codes.astype(np.float64) / self.levels - 1.0) * s).astype(np.float32)

    def decode(self, wire: Sequence[np.ndarray], n: int, what: str) -> np.ndarray:
        """The values of ``n`` coordinates from [codes, scales]; refused when malformed."""
        codes, scales = wire
        _expect(codes, np.uint8, self.code_bytes(n), f"{what} codes")
        _expect(scales, np.float32, self._blocks(n) if n else 1, f"{what} scales")
        if not np.all(np.isfinite(scales)) or np.any(scales < 0):
            raise CompressionError(f"{what}: a scale is negative or not finite; allowed: "
                                   "finite scales >= 0")
        return self._decode_codes(self._unpack(codes, n), scales, n)


@dataclass(frozen=True)
class Compression:
    """A codec for model-shaped uploads: ``topk`` (fraction kept, None: dense) and/or
    ``quantiser`` (None: float32 values); ``elias_fano``: top-k's indices Elias-Fano coded
    (else uint16 / int32)."""

    topk: float | None = None
    quantiser: Quantiser | None = None
    least: int = 1
    elias_fano: bool = False

    @classmethod
    def parse(cls, text: str) -> Compression | None:
        """The codec named by a ``compression`` setting; None for ``off``."""
        if text == "off":
            return None
        topk: float | None = None
        quantiser: Quantiser | None = None
        least = 1
        coded = False
        for part in text.split("+"):
            q, k = _Q.fullmatch(part), _TOPK.fullmatch(part)
            if part == ELIAS_FANO and topk is not None and quantiser is None and not coded:
                coded = True
            elif q is not None and quantiser is None:
                bits, block = int(q.group(1)), int(q.group(2) or 0)
                if bits not in BITS or (q.group(2) is not None and block < 1):
                    raise _bad(text)
                quantiser = Quantiser(bits, block)
            elif k is not None and topk is None and quantiser is None:
                try:
                    topk = float(k.group(1))
                except ValueError:
                    raise _bad(text) from None
                least = int(k.group(2) or 1)
                if not 0.0 < topk <= 1.0 or least < 1:
                    raise _bad(text)
            else:
                raise _bad(text)
        return cls(topk, quantiser, least, coded)

    @property
    def keeps_residual(self) -> bool:
        """Top-k keeps a residual on the device (error feedback)."""
        return self.topk is not None

    def kept(self, n: int) -> int:
        assert self.topk is not None
        return min(n, max(self.least, math.ceil(self.topk * n))) if n else 0

    def encode(self, x: Weights, rng: np.random.Generator,
               residual: Weights | None = None) -> tuple[list[np.ndarray], Weights, Weights]:
        """(wire arrays, what the server will decode, the new residual) for ``x``. Dense:
        the residual is empty. Top-k: v = x + residual; the new residual is v - decoded."""
        wire: list[np.ndarray] = []
        decoded: Weights = []
        new_residual: Weights = []
        for i, t in enumerate(x):
            flat = np.asarray(t, np.float32).ravel()
            if self.topk is None:
                assert self.quantiser is not None
                arrays, values = self.quantiser.encode(flat, rng)
                wire += arrays
                decoded.append(values.reshape(t.shape))
                continue
            v = flat.astype(np.float64)
            if residual is not None:
                v = v + np.asarray(residual[i], np.float64).ravel()
            k = self.kept(v.size)
            idx = np.sort(np.argpartition(-np.abs(v), k - 1)[:k]) if k else \
                np.zeros(0, np.int64)
            wire.append(self._index_wire(idx, v.size))
            if self.quantiser is None:
                values = v[idx].astype(np.float32)
                wire.append(values)
            else:
                arrays, values = self.quantiser.encode(v[idx], rng)
                wire += arrays
            sent = np.zeros(v.size, np.float32)
            sent[idx] = values
            decoded.append(sent.reshape(t.shape))
            new_residual.append((v - sent.astype(np.float64)).astype(np.float32)
                                .reshape(t.shape))
        return wire, decoded, new_residual

    def _index_wire(self, idx: np.ndarray, n: int) -> np.ndarray:
        if self.elias_fano:
            from fedinit.methods import elias_fano  # only a run that codes its indices

            return elias_fano.encode(idx, n)
        return idx.astype(index_dtype(n))

    def _indices(self, wire: np.ndarray, n: int, k: int, name: str) -> np.ndarray:
        """The k indices tensor ``name``'s index array names (int64); refused when
        malformed."""
        if self.elias_fano:
            from fedinit.methods import elias_fano

            try:
                return elias_fano.decode(wire, n, k, f"{name} indices")
            except elias_fano.EliasFanoError as err:
                raise CompressionError(str(err)) from None
        _expect(wire, index_dtype(n), k, f"{name} indices")
        idx = wire.astype(np.int64)  # unsigned differences would wrap
        if k and (idx[0] < 0 or idx[-1] >= n or np.any(np.diff(idx) <= 0)):
            raise CompressionError(f"{name}: indices out of 0..{n - 1} or not strictly "
                                   "ascending; allowed: k distinct ascending indices")
        return idx

    def index_bytes(self, n: int, k: int) -> int:
        """Bytes of the indices of k coordinates kept of a tensor of n."""
        if self.elias_fano:
            from fedinit.methods import elias_fano

            return elias_fano.encoded_bytes(n, k)
        return int(np.dtype(index_dtype(n)).itemsize) * k

    def arrays_per_tensor(self) -> int:
        return (0 if self.topk is None else 1) + (1 if self.quantiser is None else 2)

    def decode(self, wire: Sequence[np.ndarray], shapes: Sequence[tuple[int, ...]],
               what: str = "upload") -> Weights:
        """The model-shaped vector the wire arrays encode, for tensors of ``shapes``."""
        per = self.arrays_per_tensor()
        if len(wire) != per * len(shapes):
            raise CompressionError(f"{what}: {len(wire)} arrays is not allowed; allowed: "
                                   f"{per * len(shapes)} ({per} per tensor of the model)")
        out: Weights = []
        for i, shape in enumerate(shapes):
            n = math.prod(shape)
            part = wire[i * per:(i + 1) * per]
            name = f"{what} tensor {i}"
            if self.topk is None:
                assert self.quantiser is not None
                out.append(self.quantiser.decode(part, n, name).reshape(shape))
                continue
            k = self.kept(n)
            idx = self._indices(part[0], n, k, name)
            if self.quantiser is None:
                values = part[1]
                _expect(values, np.float32, k, f"{name} values")
                if not np.all(np.isfinite(values)):
                    raise CompressionError(f"{name}: a value is not finite; allowed: finite")
            else:
                values = self.quantiser.decode(part[1:], k, name)
            dense = np.zeros(n, np.float32)
            dense[idx] = values
            out.append(dense.reshape(shape))
        return out

    def wire_bytes(self, shapes: Sequence[tuple[int, ...]]) -> int:
        """The encoded payload of one upload of these shapes, in bytes (before packing)."""
        total = 0
        for shape in shapes:
            n = math.prod(shape)
            m = n if self.topk is None else self.kept(n)
            if self.topk is not None:
                total += self.index_bytes(n, m)
            if self.quantiser is None:
                total += 4 * m
            else:
                total += self.quantiser.code_bytes(m) + 4 * (self.quantiser._blocks(m)
                                                           if m else 1)
        return total


def index_dtype(n: int) -> type:
    """The dtype of top-k's indices in a tensor of ``n`` values: the narrowest of uint16 and
    int32 that holds n - 1."""
    return np.uint16 if n <= NARROW_INDEX else np.int32


def _expect(a: np.ndarray, dtype: type, n: int, what: str) -> None:
    if a.dtype != dtype or a.ndim != 1 or a.size != n:
        raise CompressionError(f"{what}: {a.dtype}[{a.size}] is not allowed; allowed: "
                               f"{np.dtype(dtype).name}[{n}]")


def _bad(text: str) -> CompressionError:
    return CompressionError(f"compression={text!r} is not allowed; allowed: {ALLOWED}")


__all__ = ["ALLOWED", "BITS", "ELIAS_FANO", "NARROW_INDEX", "RESIDUAL", "Compression",
           "CompressionError", "Quantiser", "index_dtype"]
