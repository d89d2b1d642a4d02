"""The server half: one round's driver, from the sampled node ids to the float sum.

Each ``*_messages`` step takes the replies that arrived (a node id missing from them has
dropped) and returns the next stage's message per node id. The server holds public keys,
ciphertexts it cannot open, masked vectors and, at the end, t shares of each survivor's
self-mask seed and of each dropped client's mask key: enough to cancel the masks in the sum,
never enough to unmask one upload.

A reply that is malformed (missing, wrong-typed or wrong-length fields, shares addressed to
clients that are not its neighbours or ciphertexts of the wrong length, a public key another
client also sent or one off Flower's curve, a masked vector of the wrong size) drops THAT
client from the protocol, as if it had not answered; so does a ciphertext that a recipient
reports it cannot open (the recipient leaves the sender out and says so in its masked-input
reply), and so does a client whose signed keys a neighbour could not verify (that neighbour
names it in its share-keys reply: it is dropped before any mask is added with it). Signatures
are passed through untouched: the server cannot make one. With signed keys (``checks``) the
unmask stage is preceded by the consistency check: every survivor is told the survivor set
U3 and signs it (``check_messages``), and the unmask request carries the signatures collected
(``unmask_after_check``); a verifying client releases nothing without t of them over its U3.
A dropped client's reason is kept in ``rejected`` for the caller to log, and the round goes
on while enough clients remain above the threshold (else ``RoundFailedError``, one line).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.common.secure_aggregation.crypto.shamir import combine_shares
from flwr.common.secure_aggregation.ndarrays_arithmetic import parameters_mod
from flwr.supercore.primitives.asymmetric import bytes_to_private_key, public_key_to_bytes

from fedinit.secure_aggregation import wire
from fedinit.secure_aggregation.envelope import key_problem, token_length
from fedinit.secure_aggregation.graph import ring_neighbours
from fedinit.secure_aggregation.masks import add_mask, pairwise_key
from fedinit.secure_aggregation.params import SecAggParams
from fedinit.secure_aggregation.quant import dequantise_sum
from fedinit.secure_aggregation.signing import MAX_SIG_BYTES
from fedinit.secure_aggregation.wire import RoundFailedError, SecAggInputError, Stage

Replies = Mapping[int, Mapping[str, Any]]
PAIR_KEY_BYTES = 32
"""A pairwise mask key (``masks.pairwise_key``)."""
MAX_SUBSETS = 2000
"""The most t-subsets of one secret's shares tried before a rebuild gives up (a corrupted
share is found by the seed hash / public key check; k <= 15 keeps C(k, t) small)."""


class SecAggServer:
    """Drive one round for ``node_ids`` uploading arrays of ``shapes``."""

    def __init__(self, params: SecAggParams, node_ids: list[int],
                 shapes: list[tuple[int, ...]]) -> None:
        if len(set(node_ids)) != len(node_ids) or any(
                not isinstance(n, int) or n < 0 for n in node_ids):
            raise SecAggInputError(f"secagg node ids must be distinct non-negative ints, "
                                   f"got {node_ids}")
        if not params.threshold <= len(node_ids) <= params.max_clients:
            raise SecAggInputError(f"secagg needs {params.threshold}..{params.max_clients} "
                                   f"clients (threshold..no wrap at bits={params.bits}), "
                                   f"got {len(node_ids)}")
        self.params = params
        self.shapes = [tuple(s) for s in shapes]
        self.sizes = [int(np.prod(s, dtype=np.int64)) for s in self.shapes]
        self.sampled = sorted(node_ids)
        # who is in each stage: U1 keys, U2 shared keys, U3 masked input, U4 unmask shares
        self.stage_clients: dict[str, list[int]] = {}
        self.rejected: list[tuple[int, str, str]] = []
        """(client id, stage, why) of each reply refused so far: that client dropped."""
        self.reported: list[int] = []
        """Clients dropped because a neighbour's masked-input reply reported that their
        encrypted shares did not open there."""

    def _reject(self, nid: int, stage: str, why: str) -> None:
        self.rejected.append((nid, stage, why))

    def _reject_reported(self, arrived: list[int], reporters: dict[int, list[int]], stage: str,
                         problem: Callable[[int, list[int]], str]) -> list[int]:
        """``arrived`` without the clients of ``reporters`` (client -> the neighbours that
        reported it), each rejected once at SHARE_KEYS: "secagg: ``problem(client, its
        reporters)`` (reported by them in the ``stage`` stage)"."""
        for nid in sorted(reporters):
            self._reject(nid, Stage.SHARE_KEYS, f"secagg: {problem(nid, sorted(reporters[nid]))} "
                         f"(reported by them in the {stage} stage)")
        return [nid for nid in arrived if nid not in reporters]

    def _arrived(self, replies: Replies, stage: str, expected: list[int],
                 check: Callable[[int, Mapping[str, Any]], None] | None = None) -> list[int]:
        """The clients of ``expected`` whose reply is well formed (``check`` raises
        SecAggInputError on one that is not: that client is dropped, its reason kept)."""
        arrived = []
        for nid in sorted(replies):
            reply, who = replies[nid], f"secagg reply from {nid}"
            try:
                if nid not in expected:
                    raise SecAggInputError(f"{who}: not a client of this stage")
                wire.stage_of(reply, stage, who)
                if check is not None:
                    check(nid, reply)
            except (TypeError, ValueError) as err:  # SecAggInputError, or a hostile value's
                self._reject(nid, stage, " ".join(str(err).split()))
                continue
            arrived.append(nid)
        self.stage_clients[stage] = arrived
        return arrived

    def setup_messages(self) -> dict[int, dict[str, Any]]:
        """The parameters and array sizes, the same for every sampled client."""
        msg = {wire.STAGE: Stage.SETUP, wire.SIZES: list(self.sizes), **self.params.to_config()}
        return {nid: dict(msg) for nid in self.sampled}

    def share_keys_messages(self, replies: Replies) -> dict[int, dict[str, Any]]:
        """Build the SecAgg+ ring over the clients that sent keys; send each its neighbours'."""
        self.pk1, self.pk2 = {}, {}
        self.sig: dict[int, bytes] = {}

        def keys(nid: int, reply: Mapping[str, Any]) -> None:
            for key in (wire.PK1, wire.PK2):
                why = key_problem(wire.get_bytes(reply, key, f"secagg reply from {nid}"))
                if why is not None:
                    raise SecAggInputError(f"secagg reply from {nid}: {key!r} {why}")
            if wire.SIG in reply:
                sig = wire.get_bytes(reply, wire.SIG, f"secagg reply from {nid}")
                if len(sig) > MAX_SIG_BYTES:
                    raise SecAggInputError(f"secagg reply from {nid}: {wire.SIG!r} has "
                                           f"{len(sig)} bytes, at most {MAX_SIG_BYTES} allowed")

        u1 = self._distinct_keys(replies, self._arrived(replies, Stage.SETUP, self.sampled,
                                                        keys))
        self._enough(u1, Stage.SETUP)
        for nid in u1:
            self.pk1[nid], self.pk2[nid] = replies[nid][wire.PK1], replies[nid][wire.PK2]
            if wire.SIG in replies[nid]:
                self.sig[nid] = replies[nid][wire.SIG]
        self.neighbours = ring_neighbours(u1, self.params.num_shares)
        out: dict[int, dict[str, Any]] = {
            nid: {wire.STAGE: Stage.SHARE_KEYS, wire.NIDS: list(nbrs),
                  wire.PK1S: [self.pk1[j] for j in nbrs], wire.PK2S: [self.pk2[j] for j in nbrs]}
            for nid, nbrs in self.neighbours.items()}
        if self.sig:  # relayed as sent (b"": that client did not sign)
            for nid, nbrs in self.neighbours.items():
                out[nid][wire.SIGS] = [self.sig.get(j, b"") for j in nbrs]
        return out

    def _distinct_keys(self, replies: Replies, arrived: list[int]) -> list[int]:
        """Drop every client whose public key another key slot also holds (its own other key
        included): a neighbour refuses a neighbourhood with a repeated key, and a copied key
        cannot be told from its owner's."""
        slots: dict[bytes, list[int]] = {}
        for nid in arrived:
            for key in (wire.PK1, wire.PK2):
                slots.setdefault(replies[nid][key], []).append(nid)
        shared = {nid for holders in slots.values() if len(holders) > 1 for nid in holders}
        for nid in sorted(shared):
            others = sorted({h for holders in slots.values() if nid in holders
                             and len(holders) > 1 for h in holders} - {nid})
            self._reject(nid, Stage.SETUP, f"secagg reply from {nid}: a public key it sent "
                         f"is also {f'sent by {others}' if others else 'its other key'}")
        kept = [nid for nid in arrived if nid not in shared]
        self.stage_clients[Stage.SETUP] = kept
        return kept

    def _enough(self, arrived: list[int], stage: str) -> None:
        if len(arrived) < self.params.threshold:
            raise RoundFailedError(f"{stage}: {len(arrived)} clients replied, fewer "
                                   f"than the threshold {self.params.threshold}; no sum")

    def collect_messages(self, replies: Replies) -> dict[int, dict[str, Any]]:
        """Route each encrypted pair of shares to its destination, which alone can open it."""
        self.seed_hash: dict[int, bytes] = {}

        def shares(src: int, reply: Mapping[str, Any]) -> None:
            who = f"secagg reply from {src}"
            dsts = wire.get_int_list(reply, wire.DSTS, who)
            ctxts = wire.get_bytes_list(reply, wire.CTXTS, who, len(dsts))
            others = [j for j in self.neighbours[src] if j != src]
            unverified = (wire.get_int_list(reply, wire.UNVERIFIED, who)
                          if wire.UNVERIFIED in reply else [])
            if len(set(unverified)) != len(unverified) or not set(unverified) <= set(others):
                raise SecAggInputError(f"{who}: {wire.UNVERIFIED!r} {unverified} are not "
                                       f"distinct neighbours ({others})")
            expected = [j for j in others if j not in set(unverified)]
            if sorted(dsts) != expected or len(set(dsts)) != len(dsts):
                raise SecAggInputError(f"{who}: destinations {sorted(dsts)}, its neighbours "
                                       f"are {expected}")
            for dst, ctxt in zip(dsts, ctxts, strict=True):
                if len(ctxt) != token_length():
                    raise SecAggInputError(f"{who}: the ciphertext for {dst} has {len(ctxt)} "
                                           f"bytes, expected {token_length()}")
            digest = wire.get_bytes(reply, wire.SEED_HASH, who)
            if len(digest) != hashlib.sha256().digest_size:
                raise SecAggInputError(f"{who}: seed hash of {len(digest)} bytes, expected 32")

        u2 = self._drop_unverified(replies, self._arrived(
            replies, Stage.SHARE_KEYS, self.stage_clients[Stage.SETUP], shares))
        self._enough(u2, Stage.SHARE_KEYS)
        inbox: dict[int, tuple[list[int], list[bytes]]] = {nid: ([], []) for nid in u2}
        for src in u2:
            dsts, ctxts = replies[src][wire.DSTS], replies[src][wire.CTXTS]
            self.seed_hash[src] = replies[src][wire.SEED_HASH]
            for dst, ctxt in zip(dsts, ctxts, strict=True):
                if dst in inbox:
                    inbox[dst][0].append(src)
                    inbox[dst][1].append(ctxt)
        for dst, (srcs, _) in inbox.items():
            if len(srcs) + 1 < self.params.threshold:
                raise RoundFailedError(f"secagg share keys: {len(srcs) + 1} of client {dst}'s "
                                       f"neighbours shared keys, fewer than the threshold "
                                       f"{self.params.threshold}; no sum")
        return {dst: {wire.STAGE: Stage.COLLECT, wire.SRCS: srcs, wire.CTXTS: ctxts}
                for dst, (srcs, ctxts) in inbox.items()}

    def _drop_unverified(self, replies: Replies, arrived: list[int]) -> list[int]:
        """``arrived`` without each client a neighbour could not verify (each rejected once,
        naming who): dropped before the masked input, no neighbour masks with it, so its
        masks need no cancelling; those neighbours sent it no share."""
        reporters: dict[int, list[int]] = {}
        for nid in arrived:
            for peer in replies[nid].get(wire.UNVERIFIED) or []:
                if peer in arrived:  # one not arrived is dropped (and logged) already
                    reporters.setdefault(peer, []).append(nid)
        kept = self._reject_reported(arrived, reporters, "share-keys", lambda peer, by: (
            f"the signed public keys of client {peer} do not verify at {by}"))
        self.stage_clients[Stage.SHARE_KEYS] = kept
        return kept

    @property
    def checks(self) -> bool:
        """Whether the round runs the consistency check: when any client signed its keys
        (a device that verifies requires it; without signatures it could prove nothing)."""
        return bool(getattr(self, "sig", None))

    def unmask_messages(self, replies: Replies) -> dict[int, dict[str, Any]]:
        """Keep the masked vectors; ask each survivor for its neighbours' shares (no check)."""
        return self._unmask_for(self._survivors(replies))

    def check_messages(self, replies: Replies) -> dict[int, dict[str, Any]]:
        """Keep the masked vectors; tell every survivor the survivor set U3 to sign."""
        u3 = self._survivors(replies)
        return {nid: {wire.STAGE: Stage.CHECK, wire.SURVIVORS: list(u3)} for nid in u3}

    def unmask_after_check(self, replies: Replies) -> dict[int, dict[str, Any]]:
        """Ask each survivor that answered the check for its shares, relaying every
        signature over U3 collected (as sent: the server cannot check or make one). One
        that did not answer stays in the sum (its masked input is in) but is asked nothing."""
        def signature(nid: int, reply: Mapping[str, Any]) -> None:
            if wire.SIG in reply:
                sig = wire.get_bytes(reply, wire.SIG, f"secagg reply from {nid}")
                if len(sig) > MAX_SIG_BYTES:
                    raise SecAggInputError(f"secagg reply from {nid}: {wire.SIG!r} has "
                                           f"{len(sig)} bytes, at most {MAX_SIG_BYTES} allowed")

        signed = self._arrived(replies, Stage.CHECK, self.stage_clients[Stage.COLLECT],
                               signature)
        self._enough(signed, Stage.CHECK)
        signers = [nid for nid in signed if wire.SIG in replies[nid]]
        msgs = self._unmask_for(signed)
        for msg in msgs.values():
            msg[wire.SIGNERS] = list(signers)
            msg[wire.SIGS] = [replies[nid][wire.SIG] for nid in signers]
        return msgs

    def _survivors(self, replies: Replies) -> list[int]:
        """U3: the clients whose well-formed masked input is kept (their vectors stored)."""
        u2 = self.stage_clients[Stage.SHARE_KEYS]
        self.masked: dict[int, list[np.ndarray]] = {}

        def vector(nid: int, reply: Mapping[str, Any]) -> None:
            """Any f/8 bytes are a field element mod 2^f: the length is all there is to
            check."""
            who = f"secagg reply from {nid}"
            raw = wire.get_bytes_list(reply, wire.MASKED, who, len(self.sizes))
            width = self.params.field_bits // 8
            for index, (blob, size) in enumerate(zip(raw, self.sizes, strict=True)):
                if len(blob) != width * size:
                    raise SecAggInputError(
                        f"{who}: masked array {index} has {len(blob)} bytes, expected "
                        f"{width * size} ({size} uint{self.params.field_bits})")

            bad = reply.get(wire.BAD_SRCS, [])
            if bad:
                bad = wire.get_int_list(reply, wire.BAD_SRCS, who)
                sent = [j for j in self.neighbours[nid] if j in set(u2) and j != nid]
                if len(set(bad)) != len(bad) or not set(bad) <= set(sent):
                    raise SecAggInputError(f"{who}: {wire.BAD_SRCS!r} {bad} are not distinct "
                                           f"neighbours that sent it shares ({sent})")

        u3 = self._drop_reported(replies, self._arrived(replies, Stage.COLLECT, u2, vector))
        self._enough(u3, Stage.COLLECT)
        dtype = self.params.value_dtype
        for nid in u3:
            self.masked[nid] = [np.frombuffer(blob, dtype=dtype).astype(np.int64)
                                for blob in replies[nid][wire.MASKED]]
        self.dropped = [n for n in u2 if n not in set(u3)]
        self._lacks = {nid: set(replies[nid].get(wire.BAD_SRCS) or []) for nid in u3}
        return u3

    def _unmask_for(self, asked: list[int]) -> dict[int, dict[str, Any]]:
        """The unmask request of each client of ``asked`` (survivors): its neighbours in U3
        (seed shares) and its dropped ones (mask-key shares), never one it holds no share of."""
        u2, u3 = self.stage_clients[Stage.SHARE_KEYS], self.stage_clients[Stage.COLLECT]
        msgs = {}
        for nid in asked:
            nbrs = [j for j in self.neighbours[nid] if j in set(u2)]
            lacks = self._lacks[nid]  # it holds no share of those
            msgs[nid] = {wire.STAGE: Stage.UNMASK,
                         wire.ACTIVE: [j for j in nbrs if j in set(u3)],
                         wire.DEAD: [j for j in nbrs if j in set(self.dropped) - lacks]}
            reveal = [j for j in nbrs if j in set(self.reported) and j != nid]
            if reveal:
                msgs[nid][wire.REVEAL] = reveal
        self._asked = msgs
        return msgs

    def _drop_reported(self, replies: Replies, arrived: list[int]) -> list[int]:
        """``arrived`` without each client a neighbour reported (its ciphertext did not open
        there: only the recipient can tell); each is rejected once, naming who reported it,
        and its mask key is rebuilt like a dropped client's. A false report only drops an
        honest client (the server cannot tell who lies); it unmasks nothing."""
        reporters: dict[int, list[int]] = {}
        for nid in arrived:
            for src in replies[nid].get(wire.BAD_SRCS) or []:
                reporters.setdefault(src, []).append(nid)
        kept = self._reject_reported(arrived, reporters, "masked-input", lambda src, by: (
            f"the encrypted shares client {src} sent to {by} do not open there"))
        self.reported = sorted(reporters)
        self.stage_clients[Stage.COLLECT] = kept
        return kept

    def aggregate(self, replies: Replies) -> list[np.ndarray]:
        """Rebuild the secrets from t shares each, cancel every mask, dequantise the sum."""
        u3 = self.stage_clients[Stage.COLLECT]

        def shares(nid: int, reply: Mapping[str, Any]) -> None:
            who = f"secagg reply from {nid}"
            asked = self._asked[nid][wire.ACTIVE] + self._asked[nid][wire.DEAD]
            nids = wire.get_int_list(reply, wire.NIDS, who)
            if nids != asked:
                raise SecAggInputError(f"{who}: shares for {nids}, asked for {asked}")
            got = wire.get_bytes_list(reply, wire.SHARES, who, len(nids))
            for owner, share in zip(nids, got, strict=True):
                self._check_share(who, owner, nid, share)
            reveal = self._asked[nid].get(wire.REVEAL, [])
            if reveal:
                if wire.get_int_list(reply, wire.REVEAL, who) != reveal:
                    raise SecAggInputError(f"{who}: {wire.REVEAL!r} is not {reveal}")
                keys = wire.get_bytes_list(reply, wire.PAIR_KEYS, who, len(reveal))
                if any(len(key) != PAIR_KEY_BYTES for key in keys):
                    raise SecAggInputError(f"{who}: a pairwise mask key is not "
                                           f"{PAIR_KEY_BYTES} bytes")

        u4 = self._arrived(replies, Stage.UNMASK, list(self._asked), shares)
        self._enough(u4, Stage.UNMASK)
        seed_shares: dict[int, list[bytes]] = {n: [] for n in u3}
        sk1_shares: dict[int, list[bytes]] = {n: [] for n in self.dropped}
        for nid in u4:
            for owner, share in zip(replies[nid][wire.NIDS], replies[nid][wire.SHARES],
                                    strict=True):
                (seed_shares if owner in seed_shares else sk1_shares)[owner].append(share)
        total = [np.zeros(s, dtype=np.int64) for s in self.sizes]
        for nid in u3:
            for acc, arr in zip(total, self.masked[nid], strict=True):
                acc += arr
        for nid in u3:
            digest = self.seed_hash[nid]
            seed = self._rebuild(nid, seed_shares[nid], "self-mask seed",
                                 lambda s, d=digest: hashlib.sha256(s).digest() == d)
            add_mask(total, seed, -1)
        revealed = {(peer, owner): key  # only what was asked (its length checked above)
                    for peer in u4 if self._asked[peer].get(wire.REVEAL)
                    for owner, key in zip(self._asked[peer][wire.REVEAL],
                                          replies[peer][wire.PAIR_KEYS], strict=True)}
        for nid in self.dropped:
            peers = [p for p in self.neighbours[nid] if p in self.masked]
            if nid in self.reported and len(sk1_shares[nid]) < self.params.threshold:
                missing = [p for p in peers if (p, nid) not in revealed]
                if missing:
                    raise RoundFailedError(
                        f"secagg unmask: {len(sk1_shares[nid])} shares of reported client "
                        f"{nid}'s mask key (threshold {self.params.threshold}) and no mask key "
                        f"of its pair with {missing}; no sum")
                pair_keys = [revealed[(p, nid)] for p in peers]
            else:
                sk1 = self._rebuild(nid, sk1_shares[nid], "mask key",
                                    lambda s, pk=self.pk1[nid]: _private_key_of(s, pk))
                key = bytes_to_private_key(sk1)
                pair_keys = [pairwise_key(key, self.pk1[p]) for p in peers]
            for peer, pair_key in zip(peers, pair_keys, strict=True):
                add_mask(total, pair_key, -1 if peer > nid else 1)  # peer added +mask if > nid
        summed = parameters_mod(total, self.params.modulus)
        return dequantise_sum(summed, len(u3), self.params, self.shapes)

    def _check_share(self, who: str, owner: int, holder: int, share: bytes) -> None:
        """Flower's share layout: 4-byte index (holder's place in owner's list + 1), 16n bytes."""
        if len(share) < 20 or (len(share) - 4) % 16:
            raise SecAggInputError(f"{who}: share of {owner} has {len(share)} bytes, expected "
                                   f"4 + a multiple of 16")
        index = int.from_bytes(share[:4], "little")
        if index != self.neighbours[owner].index(holder) + 1:
            raise SecAggInputError(f"{who}: share of {owner} has index {index}, expected "
                                   f"{self.neighbours[owner].index(holder) + 1}")

    def _rebuild(self, owner: int, shares: list[bytes], what: str,
                 valid: Callable[[bytes], bool]) -> bytes:
        """The secret of t of the shares that passes ``valid`` (its hash / its public key):
        a corrupted share is outvoted by trying other t-subsets, while there are more than t."""
        t = self.params.threshold
        if len(shares) < t:
            raise RoundFailedError(
                f"secagg unmask: {len(shares)} shares of client {owner}'s {what}, the threshold "
                f"is {t} (more than {self.params.max_dropouts} of its neighbours dropped); no sum")
        for subset in itertools.islice(itertools.combinations(shares, t), MAX_SUBSETS):
            if len({len(s) for s in subset}) != 1:
                continue
            try:
                secret = combine_shares(list(subset))
            except ValueError:
                continue
            if valid(secret):
                return secret
        raise SecAggInputError(f"secagg: no {t} of the {len(shares)} shares of client {owner}'s "
                               f"{what} rebuild it (malformed shares); no sum")


def _private_key_of(raw: bytes, public: bytes) -> bool:
    """Whether ``raw`` is the private key whose public key is ``public``."""
    try:
        key = bytes_to_private_key(raw)
    except ValueError:
        return False
    return public_key_to_bytes(key.public_key()) == public
