"""Mask expansion and pairwise mask keys.

Flower's ``pseudo_rand_gen`` folds its seed to 32 bits (XOR of 4-byte words) and seeds
numpy's MT19937, so a mask has at most 2^32 possible values: a server can search them. Masks
here are the ChaCha20 keystream (``cryptography``, a maintained library) under the full
32-byte key, read as little-endian uint32: uniform modulo 2^32 = MODULUS. Keys are fresh each
round (new key pairs, new seed), so the fixed nonce is never reused with one key.
"""

from __future__ import annotations

import base64

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
from flwr.supercore.primitives.asymmetric import bytes_to_public_key

_NONCE = bytes(16)


def expand(key: bytes, sizes: list[int]) -> list[np.ndarray]:
    """One int64 array of uniform values in [0, 2^32) per size, from a 32-byte key."""
    total = sum(sizes)
    stream = Cipher(algorithms.ChaCha20(key, _NONCE), mode=None).encryptor().update(
        bytes(4 * total))
    flat = np.frombuffer(stream, dtype="<u4").astype(np.int64)
    return np.split(flat, np.cumsum(sizes)[:-1]) if sizes else []


def pairwise_key(own_sk1: ec.EllipticCurvePrivateKey, peer_pk1: bytes) -> bytes:
    """The 32-byte key i and j agree on (ECDH + HKDF, Flower's ``generate_shared_key``)."""
    return base64.urlsafe_b64decode(generate_shared_key(own_sk1, bytes_to_public_key(peer_pk1)))


def add_mask(total: list[np.ndarray], key: bytes, sign: int) -> None:
    """Add ``sign`` times the (self or pairwise) mask under ``key`` to ``total``; mod later."""
    for arr, mask in zip(total, expand(key, [a.size for a in total]), strict=True):
        arr += sign * mask
