"""Signed key advertisements: a relaying server cannot swap a client's SecAgg+ public keys.

Without them the server relays each client's pk1 / pk2 unauthenticated and can stand in the
middle: hand a device its own keys in place of its neighbours', open the shares the device
encrypts to them and rebuild its masks (Bonawitz et al. 2017, active adversary; Bell et al.
2020). Here each client signs the statement (run id, round, its client id, pk1, pk2) with a
key of its own device (ECDSA, Flower's ``sign_message`` / ``verify_signature``), the server
passes the signature through, and a client whose device holds the operator's list of client
ids and their public keys verifies each neighbour's before it uses any of its keys.

The statement binds the round and run, so a signature the server kept from another round or
run does not verify. The same device key signs, in the consistency check (Bell et al. 2020;
Bonawitz et al. 2017, round 3), the survivor set U3 the server says it will sum: a device
releases its unmask shares only with t valid signatures of listed clients over the U3 it was
told (``survivors_statement``). docs/algorithms.md, "Signed keys" and "Consistency check".
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import ec
from flwr.supercore.primitives.asymmetric import sign_message, verify_signature

TAG = b"fedinit secagg+ keys v1\x00"
"""Domain separation: a signature over this statement is no signature over anything else."""
SURVIVORS_TAG = b"fedinit secagg+ survivors v1\x00"
"""The consistency check's domain: a key signature is never a survivor-set signature."""
MAX_SIG_BYTES = 160
"""An ECDSA signature (DER) on P-521 is at most 139 bytes; the server refuses longer ones."""
U64 = 2**64


def statement(run_id: int, server_round: int, client_id: int, pk1: bytes, pk2: bytes) -> bytes:
    """The signed bytes: tag, run id, round, client id (8 bytes each), each key with its length.

    Lengths make the encoding unambiguous (no two statements share their bytes)."""
    for name, value in (("run id", run_id), ("round", server_round), ("client id", client_id)):
        if not 0 <= value < U64:
            raise ValueError(f"secagg signed keys: {name} {value} is not in 0..2^64-1")
    return (TAG + struct.pack(">QQQ", run_id, server_round, client_id)
            + struct.pack(">I", len(pk1)) + pk1 + struct.pack(">I", len(pk2)) + pk2)


def survivors_statement(run_id: int, server_round: int, survivors: Sequence[int]) -> bytes:
    """The consistency check's signed bytes: tag, run id, round, the count and the sorted
    survivor ids (8 bytes each): one set, one statement, whatever order it was sent in."""
    ids = sorted(survivors)
    for name, value in (("run id", run_id), ("round", server_round), *(
            ("client id", i) for i in ids)):
        if not 0 <= value < U64:
            raise ValueError(f"secagg survivor set: {name} {value} is not in 0..2^64-1")
    if len(set(ids)) != len(ids):
        raise ValueError(f"secagg survivor set: {ids} lists a client twice")
    return (SURVIVORS_TAG + struct.pack(">QQI", run_id, server_round, len(ids))
            + b"".join(struct.pack(">Q", i) for i in ids))


@dataclass(frozen=True)
class KeyTrust:
    """What one device signs with and whom it believes: its own private key (None: it does
    not sign) and the operator's client id -> public key list (None: it verifies nothing;
    given: every neighbour's keys must carry a valid signature by that client's key)."""

    signing_key: ec.EllipticCurvePrivateKey | None = None
    peers: Mapping[int, ec.EllipticCurvePublicKey] | None = None

    @property
    def verifies(self) -> bool:
        """Whether this device requires signed keys from every neighbour."""
        return self.peers is not None

    def sign(self, run_id: int, server_round: int, client_id: int, pk1: bytes,
             pk2: bytes) -> bytes | None:
        """This device's signature over the statement, or None when it has no key."""
        if self.signing_key is None:
            return None
        return sign_message(self.signing_key,
                            statement(run_id, server_round, client_id, pk1, pk2))

    def own_key_problem(self, client_id: int) -> str | None:
        """Why this device cannot sign as ``client_id`` (one line), or None: the peer list
        must name this device's own public key for that id, else its neighbours would drop
        it (a server naming the device another client's id included)."""
        if self.peers is None or self.signing_key is None:
            return None
        listed = self.peers.get(client_id)
        if listed is None:
            return f"client id {client_id} is not in this device's secagg-peer-keys"
        if listed.public_numbers() != self.signing_key.public_key().public_numbers():
            return (f"secagg-peer-keys lists another public key for client {client_id} than "
                    "this device's secagg-signing-key")
        return None

    def problem(self, run_id: int, server_round: int, client_id: int, pk1: bytes, pk2: bytes,
                sig: bytes | None) -> str | None:
        """Why ``client_id``'s keys are not to be used (one line), or None when they verify
        (or this device verifies nothing)."""
        if self.peers is None:
            return None
        key = self.peers.get(client_id)
        if key is None:
            return "it is not in this device's secagg-peer-keys"
        if not sig:
            return "its keys are not signed"
        if not verify_signature(key, statement(run_id, server_round, client_id, pk1, pk2),
                                sig):
            return (f"its signature does not verify for run {run_id}, round {server_round} "
                    "under its key in secagg-peer-keys (keys swapped, or a signature from "
                    "another round or run)")
        return None

    def sign_survivors(self, run_id: int, server_round: int,
                       survivors: Sequence[int]) -> bytes | None:
        """This device's signature over the survivor set it was told, or None (no key)."""
        if self.signing_key is None:
            return None
        return sign_message(self.signing_key,
                            survivors_statement(run_id, server_round, survivors))

    def survivor_signers(self, run_id: int, server_round: int, survivors: Sequence[int],
                         signers: Sequence[int], sigs: Sequence[bytes],
                         need: int | None = None) -> list[int]:
        """The distinct clients of ``survivors`` listed in this device's peer keys whose
        signature over exactly this (run, round, survivor set) verifies; every other entry
        (unlisted, not a survivor, unsigned, forged, over another set, round or run) counts
        for nothing. Verifying stops once ``need`` are found (a device needs t, not all n).
        Empty when this device verifies nothing."""
        if self.peers is None:
            return []
        text = survivors_statement(run_id, server_round, survivors)
        members, valid = set(survivors), set()
        for signer, sig in zip(signers, sigs, strict=True):
            if need is not None and len(valid) >= need:
                break
            key = self.peers.get(signer)
            if (signer in members and signer not in valid and key is not None and sig
                    and verify_signature(key, text, sig)):
                valid.add(signer)
        return sorted(valid)
