"""Elias-Fano coding of top-k's indices: k ascending indices in 0..n-1 in about
2 + log2(n / k) bits each, where uint16 takes 16.

Top-k's indices are most of its bytes: at 2% of the default CNN with 8-bit values an upload
is 2 bytes of index and 1 of value per coordinate. An ascending set of k indices below n
needs only about log2(C(n, k)) ~ k (log2(n / k) + 1.44) bits, and Elias-Fano (Elias 1974,
Fano 1971; as in search engines' posting lists) comes within 2 bits of that, with a
vectorised decode. Each index i is split into its L = max(0, floor(log2(n / k))) low bits,
written as they are, and its high part h = i >> L, written in unary: in an upper bit array
of k + ((n - 1) >> L) bits, the j-th index (from 0) sets bit h_j + j. Both parts go in one
uint8 array, upper first; the bit order in a byte is numpy's ``packbits`` default (the most
significant bit first).

The decode is the server's and a client's array is its word: the byte count must be exact,
the upper array must hold exactly k set bits and no padding bit set, the indices must come
out strictly ascending and below n; anything else is refused in one line
(``EliasFanoError``) before an index is used. So one set of indices has one encoding.
"""

from __future__ import annotations

import numpy as np


class EliasFanoError(ValueError):
    """An encoded index array that cannot be used; one line."""


def low_bits(n: int, k: int) -> int:
    """L, the low bits written as they are, for k indices below n (0 when k is 0)."""
    if k <= 0 or n <= k:
        return 0
    return (n // k).bit_length() - 1  # floor(log2(n / k)) without floating point


def upper_bits(n: int, k: int) -> int:
    """Bits of the unary upper array of k indices below n."""
    return k + ((n - 1) >> low_bits(n, k)) if k else 0


def encoded_bytes(n: int, k: int) -> int:
    """Bytes of the encoding of k indices below n (0 for none)."""
    if k == 0:
        return 0
    return -(-upper_bits(n, k) // 8) + -(-k * low_bits(n, k) // 8)


def encode(idx: np.ndarray, n: int) -> np.ndarray:
    """The uint8 encoding of ``idx`` (strictly ascending, in 0..n-1)."""
    idx = np.asarray(idx, np.int64)
    k = idx.size
    if k == 0:
        return np.zeros(0, np.uint8)
    width = low_bits(n, k)
    upper = np.zeros(-(-upper_bits(n, k) // 8) * 8, np.uint8)
    upper[(idx >> width) + np.arange(k)] = 1
    if width == 0:
        return np.packbits(upper)
    low = idx & ((1 << width) - 1)
    low_bits_matrix = (low[:, None] >> np.arange(width - 1, -1, -1)) & 1
    return np.concatenate([np.packbits(upper), np.packbits(low_bits_matrix.astype(np.uint8))])


def decode(code: np.ndarray, n: int, k: int, what: str) -> np.ndarray:
    """The k indices (int64, strictly ascending, below n) ``code`` encodes; refused in one
    line when it is not the one encoding of such a set."""
    want = encoded_bytes(n, k)
    if code.dtype != np.uint8 or code.ndim != 1 or code.size != want:
        raise EliasFanoError(f"{what}: {code.dtype}[{code.size}] is not allowed; allowed: "
                             f"uint8[{want}] (Elias-Fano, {k} indices below {n})")
    if k == 0:
        return np.zeros(0, np.int64)
    width, n_upper = low_bits(n, k), upper_bits(n, k)
    upper_bytes = -(-n_upper // 8)
    ones = np.flatnonzero(np.unpackbits(code[:upper_bytes]))
    if ones.size != k or ones[-1] >= n_upper:
        raise EliasFanoError(f"{what}: the upper bits hold {ones.size} set bits ending at bit "
                             f"{ones[-1] if ones.size else -1}; allowed: exactly {k}, all "
                             f"below bit {n_upper}")
    high = ones - np.arange(k)
    if width:
        bits = np.unpackbits(code[upper_bytes:])
        if bits[k * width:].any():
            raise EliasFanoError(f"{what}: a padding bit after the low bits is set; allowed: "
                                 "zero padding")
        weights = np.int64(1) << np.arange(width - 1, -1, -1, dtype=np.int64)
        low = bits[:k * width].reshape(k, width).astype(np.int64) @ weights
        idx = (high << width) | low
    else:
        idx = high
    if idx[-1] >= n or np.any(np.diff(idx) <= 0):
        raise EliasFanoError(f"{what}: indices out of 0..{n - 1} or not strictly ascending; "
                             "allowed: k distinct ascending indices")
    return idx


__all__ = ["EliasFanoError", "decode", "encode", "encoded_bytes", "low_bits", "upper_bits"]
