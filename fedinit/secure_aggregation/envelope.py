"""The encrypted pair of shares one client sends another, and the public keys that seal it.

Every honest ciphertext of a round has the same length (two fixed-size Shamir shares and two
8-byte ids under Fernet), so the server rejects a ciphertext of another length itself; one
of the right length that does not open (garbage bytes, another key, another pair's shares)
only its recipient can tell, and reports (``wire.BAD_SRCS``): the server then drops the
sender as if it had left after key sharing. docs/algorithms.md, "Secure aggregation".
"""

from __future__ import annotations

import functools
import os

from cryptography.fernet import InvalidToken
from cryptography.hazmat.primitives.asymmetric import ec
from flwr.common.secure_aggregation.crypto.shamir import create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
    decrypt,
    encrypt,
    generate_shared_key,
)
from flwr.common.secure_aggregation.secaggplus_utils import (
    share_keys_plaintext_concat,
    share_keys_plaintext_separate,
)
from flwr.supercore.primitives.asymmetric import (
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
)

CURVE = "secp384r1"
"""The curve of Flower's ``generate_key_pairs``: a key on another curve cannot agree a key."""


@functools.cache
def token_length() -> int:
    """The byte length of every honest ciphertext (made here with the clients' own steps)."""
    sk, _ = generate_key_pairs()
    other, other_pk = generate_key_pairs()
    plain = share_keys_plaintext_concat(
        2**64 - 1, 2**64 - 1, create_shares(os.urandom(32), 2, 3)[0],
        create_shares(private_key_to_bytes(sk), 2, 3)[0])
    return len(encrypt(generate_shared_key(other, other_pk), plain))


def key_problem(raw: bytes) -> str | None:
    """Why ``raw`` is not a usable public key (PEM, elliptic curve, Flower's curve), or None."""
    try:
        key = bytes_to_public_key(raw)
    except ValueError:
        return "is not a PEM public key"
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != CURVE:
        return f"is not a public key on {CURVE}"
    return None


def open_shares(key: bytes, ctxt: bytes, src: int, dst: int,
                lengths: tuple[int, int]) -> tuple[bytes, bytes] | str:
    """The (seed share, mask-key share) ``src`` sent ``dst``, or why they cannot be used: the
    ciphertext does not decrypt, is labelled for another pair, or holds shares of other
    lengths than ``dst``'s own (every client's shares have the same layout)."""
    try:
        plain = decrypt(key, ctxt)
    except (InvalidToken, TypeError, ValueError):
        return "they do not decrypt (tampered, garbage or sealed for another pair)"
    got_src, got_dst, seed_share, sk1_share = share_keys_plaintext_separate(plain)
    if (got_src, got_dst) != (src, dst):
        return f"they are labelled {got_src}->{got_dst}, sent as {src}->{dst}"
    if (len(seed_share), len(sk1_share)) != lengths:
        return (f"shares of {len(seed_share)} and {len(sk1_share)} bytes, expected "
                f"{lengths[0]} and {lengths[1]}")
    return seed_share, sk1_share
