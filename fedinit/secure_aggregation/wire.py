"""Message keys and the one-line checks every received dict goes through first."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SecAggInputError(ValueError):
    """A malformed protocol message: one line naming the field, the sender and what is allowed."""


class RoundFailedError(RuntimeError):
    """Too many dropouts for the threshold: the round has no sum (never a wrong one)."""


class Stage:
    """The stages, in order; each message carries its stage under ``STAGE``. ``CHECK`` (the
    consistency check) runs only with signed keys (``signing``)."""

    SETUP = "secagg-setup"
    SHARE_KEYS = "secagg-share-keys"
    COLLECT = "secagg-collect-masked"
    CHECK = "secagg-consistency-check"
    UNMASK = "secagg-unmask"


RECORD = "secagg"  # the Message's ConfigRecord that carries a stage's dict (a run's wiring)
STAGE = "stage"
PK1, PK2 = "pk1", "pk2"  # mask-agreement and share-encryption public keys (PEM)
SIG = "sig"  # in setup: the device's signature over (run, round, client id, pk1, pk2); in the
# consistency check: its signature over (run, round, SURVIVORS)
NIDS, PK1S, PK2S = "nids", "pk1s", "pk2s"
SIGS = "sigs"  # in share keys: each neighbour's SIG as it sent it (b"": unsigned); in unmask:
# the SIGNERS' signatures over the survivor set, as they sent them in the consistency check
SURVIVORS = "survivors"  # in the consistency check: U3, the sorted ids the server will sum
SIGNERS = "signers"  # in unmask after the check: who returned a signature over SURVIVORS
UNVERIFIED = "unverified"  # the share-keys reply: neighbours whose signed keys did not verify
DSTS, CTXTS, SRCS = "dsts", "ctxts", "srcs"
SEED_HASH = "seed-hash"  # SHA-256 of the self-mask seed: lets the server detect a bad share
MASKED = "masked"  # one little-endian uint32 byte string per array
BAD_SRCS = "bad-srcs"  # in the masked reply: neighbours whose encrypted shares did not open
ACTIVE, DEAD = "active", "dead"
REVEAL = "reveal"  # in unmask: reported (dropped) neighbours whose pairwise mask key to disclose
PAIR_KEYS = "pair-keys"  # the reply: those 32-byte pairwise mask keys, in REVEAL's order
SHARES = "shares"
SIZES = "sizes"


def stage_of(msg: Mapping[str, Any], expected: str, sender: str) -> None:
    """Refuse a message of another stage."""
    got = msg.get(STAGE)
    if got != expected:
        raise SecAggInputError(f"{sender}: stage {got!r} where {expected!r} was expected")


def get_int_list(msg: Mapping[str, Any], key: str, sender: str) -> list[int]:
    """A list of non-negative ints (node ids, sizes), no bools."""
    value = msg.get(key)
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise SecAggInputError(f"{sender}: {key!r} must be a list of non-negative ints, "
                               f"got {type(value).__name__}")
    return list(value)


def get_bytes(msg: Mapping[str, Any], key: str, sender: str) -> bytes:
    """One non-empty byte string."""
    value = msg.get(key)
    if not isinstance(value, bytes) or not value:
        raise SecAggInputError(f"{sender}: {key!r} must be non-empty bytes, "
                               f"got {type(value).__name__}")
    return value


def get_bytes_list(msg: Mapping[str, Any], key: str, sender: str, length: int) -> list[bytes]:
    """A list of exactly ``length`` byte strings."""
    value = msg.get(key)
    if not isinstance(value, list) or not all(isinstance(v, bytes) for v in value):
        raise SecAggInputError(f"{sender}: {key!r} must be a list of bytes, "
                               f"got {type(value).__name__}")
    if len(value) != length:
        raise SecAggInputError(f"{sender}: {key!r} has {len(value)} entries, expected {length}")
    return list(value)
