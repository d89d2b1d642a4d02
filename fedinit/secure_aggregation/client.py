"""The client half: one state machine per round, setup -> share keys -> masked input ->
(consistency check) -> unmask.

Each step takes the server's dict and returns the reply dict; the private keys, the self-mask
seed and the unmasked vector never leave this object. A step out of order, or a second unmask
request (a server fishing for the other kind of share), is refused. With a ``KeyTrust`` the
client signs its keys for (run, round) and uses only neighbours whose signed keys verify
(``signing``): one that does not is left out as if it had dropped, and reported. A client
that verifies (a peer list) also requires the consistency check: it signs the survivor set
U3 it is told, once, and releases its unmask shares only for exactly that U3 and only with t
valid signatures of listed survivors over it.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.common.logger import log
from flwr.common.secure_aggregation.crypto.shamir import create_shares
from flwr.common.secure_aggregation.crypto.symmetric_encryption import (
    encrypt,
    generate_shared_key,
)
from flwr.common.secure_aggregation.ndarrays_arithmetic import parameters_mod
from flwr.common.secure_aggregation.secaggplus_utils import share_keys_plaintext_concat
from flwr.supercore.primitives.asymmetric import (
    bytes_to_private_key,
    bytes_to_public_key,
    generate_key_pairs,
    private_key_to_bytes,
    public_key_to_bytes,
)

from fedinit.secure_aggregation import wire
from fedinit.secure_aggregation.envelope import open_shares
from fedinit.secure_aggregation.masks import add_mask, expand, pairwise_key
from fedinit.secure_aggregation.params import SecAggParams
from fedinit.secure_aggregation.quant import check_vector, quantise
from fedinit.secure_aggregation.signing import KeyTrust
from fedinit.secure_aggregation.wire import SecAggInputError, Stage

_ORDER = (Stage.SETUP, Stage.SHARE_KEYS, Stage.COLLECT, Stage.CHECK, Stage.UNMASK)
DONE = "done"


class SecAggClient:
    """One client's side of one round."""

    def __init__(self, node_id: int, trust: KeyTrust | None = None, run_id: int = 0,
                 server_round: int = 0) -> None:
        self.node_id = node_id
        self.trust = trust or KeyTrust()
        self.run_id, self.server_round = run_id, server_round
        """What the keys are signed for (and neighbours' verified against): set at setup."""
        self._bad: list[int] = []
        self._u3: list[int] | None = None
        """The survivor set this client signed in the consistency check (None: no check)."""
        self._next = Stage.SETUP
        self._who = f"secagg client {node_id}"

    def handle(self, msg: Mapping[str, Any], vector: list[np.ndarray] | None = None
               ) -> dict[str, Any]:
        """Dispatch on the message's stage (the masked-input stage needs ``vector``)."""
        stage = msg.get(wire.STAGE)
        if stage == Stage.COLLECT:
            if vector is None:
                raise SecAggInputError(f"{self._who}: the masked-input stage needs a vector")
            return self.masked_input(msg, vector)
        steps = {Stage.SETUP: self.setup, Stage.SHARE_KEYS: self.share_keys,
                 Stage.CHECK: self.check, Stage.UNMASK: self.unmask}
        if stage not in steps:
            raise SecAggInputError(f"{self._who}: unknown stage {stage!r}; allowed: "
                                   f"{', '.join(_ORDER)}")
        return steps[stage](msg)

    def _enter(self, msg: Mapping[str, Any], stage: str) -> None:
        wire.stage_of(msg, stage, self._who)
        if self._next != stage:
            raise SecAggInputError(f"{self._who}: {stage!r} out of order, expected "
                                   f"{self._next!r}")

    def setup(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        """Check the parameters (t > k/2 included) and make two fresh key pairs."""
        self._enter(msg, Stage.SETUP)
        self.params = SecAggParams.from_config(msg)
        self.sizes = wire.get_int_list(msg, wire.SIZES, self._who)
        own = self.trust.own_key_problem(self.node_id)
        if own is not None:
            raise SecAggInputError(f"{self._who}: {own}: it does not sign keys as that client")
        self._sk1, pk1 = generate_key_pairs()  # pairwise masks
        self._sk2, pk2 = generate_key_pairs()  # encrypting shares for neighbours
        self._pk1, self._pk2 = public_key_to_bytes(pk1), public_key_to_bytes(pk2)
        self._next = Stage.SHARE_KEYS
        out: dict[str, Any] = {wire.STAGE: Stage.SETUP, wire.PK1: self._pk1, wire.PK2: self._pk2}
        sig = self.trust.sign(self.run_id, self.server_round, self.node_id, self._pk1, self._pk2)
        if sig is not None:
            out[wire.SIG] = sig
        return out

    def _untrusted(self, msg: Mapping[str, Any], ids: list[int], pk1s: list[bytes],
                   pk2s: list[bytes]) -> dict[int, str]:
        """The neighbours whose keys this client must not use, and why: none unless it
        verifies; then each whose signature over (run, round, id, pk1, pk2) fails."""
        if not self.trust.verifies:
            return {}
        if wire.SIGS not in msg:
            raise SecAggInputError(f"{self._who}: the server sent its neighbours' keys without "
                                   "signatures; this device requires them (secagg-peer-keys)")
        sigs = wire.get_bytes_list(msg, wire.SIGS, self._who, len(ids))
        out = {}
        for nid, pk1, pk2, sig in zip(ids, pk1s, pk2s, sigs, strict=True):
            if nid == self.node_id:
                continue
            why = self.trust.problem(self.run_id, self.server_round, nid, pk1, pk2, sig)
            if why is not None:
                out[nid] = why
        return out

    def share_keys(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        """Shamir-share the self-mask seed and the mask key sk1; encrypt each pair of shares."""
        self._enter(msg, Stage.SHARE_KEYS)
        ids = wire.get_int_list(msg, wire.NIDS, self._who)
        pk1s = wire.get_bytes_list(msg, wire.PK1S, self._who, len(ids))
        pk2s = wire.get_bytes_list(msg, wire.PK2S, self._who, len(ids))
        t, k = self.params.threshold, self.params.num_shares
        if not t <= len(ids) <= k or len(set(ids)) != len(ids):
            raise SecAggInputError(f"{self._who}: {len(ids)} distinct neighbours needed in "
                                   f"{t}..{k}, got {len(set(ids))} of {len(ids)}")
        if len(set(pk1s + pk2s)) != 2 * len(ids):
            raise SecAggInputError(f"{self._who}: neighbours' public keys are not all distinct")
        if self.node_id not in ids:
            raise SecAggInputError(f"{self._who}: not in its own neighbour list")
        me = ids.index(self.node_id)
        if (pk1s[me], pk2s[me]) != (self._pk1, self._pk2):
            raise SecAggInputError(f"{self._who}: its own public keys were replaced")
        untrusted = self._untrusted(msg, ids, pk1s, pk2s)
        for nid, why in untrusted.items():  # never a share or a mask under a key it cannot trust
            log(WARNING, "%s: left out client %d, whose keys it cannot verify (%s); reported "
                "to the server", self._who, nid, why)
        if len(ids) - len(untrusted) < t:
            raise SecAggInputError(f"{self._who}: {len(ids) - len(untrusted)} clients of its "
                                   f"neighbourhood have keys it can verify, fewer than the "
                                   f"threshold {t}")
        self._pk1s = {nid: pk for nid, pk in zip(ids, pk1s, strict=True)
                      if nid not in untrusted}
        self._seed = os.urandom(32)
        seed_shares = create_shares(self._seed, t, len(ids))
        sk1_shares = create_shares(private_key_to_bytes(self._sk1), t, len(ids))
        self._enc_keys: dict[int, bytes] = {}
        self._held: dict[int, tuple[bytes, bytes]] = {self.node_id: (seed_shares[me],
                                                                      sk1_shares[me])}
        dsts, ctxts = [], []
        for pos, nid in enumerate(ids):
            if nid == self.node_id or nid in untrusted:
                continue
            try:
                key = generate_shared_key(self._sk2, bytes_to_public_key(pk2s[pos]))
            except ValueError as err:
                raise SecAggInputError(f"{self._who}: pk2 of {nid} is not a public key") from err
            self._enc_keys[nid] = key
            plain = share_keys_plaintext_concat(self.node_id, nid, seed_shares[pos],
                                                sk1_shares[pos])
            dsts.append(nid)
            ctxts.append(encrypt(key, plain))
        self._next = Stage.COLLECT
        out = {wire.STAGE: Stage.SHARE_KEYS, wire.DSTS: dsts, wire.CTXTS: ctxts,
               wire.SEED_HASH: hashlib.sha256(self._seed).digest()}
        if untrusted:
            out[wire.UNVERIFIED] = sorted(untrusted)
        return out

    def masked_input(self, msg: Mapping[str, Any], vector: list[np.ndarray]) -> dict[str, Any]:
        """Keep the neighbours' shares; upload q(x) + PRG(seed) +- pairwise masks mod 2^32.

        A neighbour whose ciphertext does not open is left out (logged once) and named in the
        reply (``BAD_SRCS``): the server drops it, so the pairwise mask added with it here is
        cancelled with its mask key, rebuilt from the other neighbours' shares."""
        self._enter(msg, Stage.COLLECT)
        srcs = wire.get_int_list(msg, wire.SRCS, self._who)
        ctxts = wire.get_bytes_list(msg, wire.CTXTS, self._who, len(srcs))
        if len(set(srcs)) != len(srcs) or not set(srcs) <= set(self._enc_keys):
            raise SecAggInputError(f"{self._who}: sources {srcs} are not distinct neighbours")
        if len(srcs) + 1 < self.params.threshold:
            raise SecAggInputError(f"{self._who}: {len(srcs) + 1} clients in its neighbourhood "
                                   f"shared keys, fewer than the threshold "
                                   f"{self.params.threshold}")
        check_vector(vector, self.sizes)
        own = tuple(len(s) for s in self._held[self.node_id])
        bad = []
        for src, ctxt in zip(srcs, ctxts, strict=True):
            opened = open_shares(self._enc_keys[src], ctxt, src, self.node_id,
                                 (own[0], own[1]))
            if isinstance(opened, str):  # only this client can tell: it reports the sender
                bad.append(src)
                log(WARNING, "%s: left out client %d, whose encrypted shares cannot be used "
                    "(%s); reported to the server", self._who, src, opened)
                continue
            self._held[src] = opened
        self._bad = bad
        total = [q + m for q, m in zip(quantise(vector, self.params),
                                       expand(self._seed, self.sizes), strict=True)]
        for src in srcs:
            add_mask(total, pairwise_key(self._sk1, self._pk1s[src]),
                           1 if self.node_id > src else -1)
        masked = parameters_mod(total, self.params.modulus)
        self._next = Stage.CHECK  # optional unless this client verifies (``unmask``)
        dtype = self.params.value_dtype
        return {wire.STAGE: Stage.COLLECT,
                wire.MASKED: [a.astype(dtype).tobytes() for a in masked], wire.BAD_SRCS: bad}

    def check(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        """The consistency check: sign the survivor set U3 the server says it will sum, once
        per round; refused unless U3 holds this client and at least t clients."""
        self._enter(msg, Stage.CHECK)
        u3 = wire.get_int_list(msg, wire.SURVIVORS, self._who)
        if u3 != sorted(set(u3)):
            raise SecAggInputError(f"{self._who}: the survivor set {u3} is not sorted and "
                                   "distinct")
        if self.node_id not in u3:
            raise SecAggInputError(f"{self._who}: not in the survivor set {u3} it is asked "
                                   "to sign")
        if len(u3) < self.params.threshold:
            raise SecAggInputError(f"{self._who}: a survivor set of {len(u3)} clients, fewer "
                                   f"than the threshold {self.params.threshold}")
        self._u3 = u3
        self._next = Stage.UNMASK
        out: dict[str, Any] = {wire.STAGE: Stage.CHECK}
        sig = self.trust.sign_survivors(self.run_id, self.server_round, u3)
        if sig is not None:
            out[wire.SIG] = sig
        return out

    def _checked(self, active: list[int], dead: list[int], msg: Mapping[str, Any]) -> None:
        """After the check: the unmask request must follow the signed U3 (its active
        neighbours are those it holds shares of in U3, its dead ones the rest), and a
        verifying client must see t valid signatures of listed survivors over that U3."""
        assert self._u3 is not None
        u3, held = set(self._u3), set(self._held)
        if set(active) != held & u3 or set(dead) != held - u3:
            raise SecAggInputError(
                f"{self._who}: refused to release its shares: asked for seed shares of "
                f"{sorted(active)} and mask-key shares of {sorted(dead)}, but the survivor set "
                f"it signed makes them {sorted(held & u3)} and {sorted(held - u3)}")
        if not self.trust.verifies:
            return
        signers = wire.get_int_list(msg, wire.SIGNERS, self._who)
        sigs = wire.get_bytes_list(msg, wire.SIGS, self._who, len(signers))
        valid = self.trust.survivor_signers(self.run_id, self.server_round, self._u3,
                                            signers, sigs, need=self.params.threshold)
        if len(valid) < self.params.threshold:
            raise SecAggInputError(
                f"{self._who}: refused to release its shares: {len(valid)} valid signatures "
                f"of listed survivors over the survivor set it was told ({len(self._u3)} "
                f"clients, run {self.run_id}, round {self.server_round}), fewer than the "
                f"threshold {self.params.threshold} ({len(signers)} sent; the server may be "
                "telling clients different survivor sets)")

    def unmask(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        """Release seed shares of survivors and sk1 shares of the dropped, never both, once;
        for dropped neighbours it could not take shares from (reported), the pairwise mask
        key it shares with each, which is what their sk1 would reveal of it. A verifying
        client first requires the consistency check and its signatures (``_checked``)."""
        wire.stage_of(msg, Stage.UNMASK, self._who)
        if self._next == Stage.CHECK and self.trust.verifies:
            raise SecAggInputError(f"{self._who}: refused to release its shares: the server "
                                   "asked for them without the consistency check; this device "
                                   "requires it (secagg-peer-keys)")
        if self._next == Stage.CHECK:  # the check is skipped without signed keys
            self._next = Stage.UNMASK
        self._enter(msg, Stage.UNMASK)
        active = wire.get_int_list(msg, wire.ACTIVE, self._who)
        dead = wire.get_int_list(msg, wire.DEAD, self._who)
        asked = active + dead
        if len(set(asked)) != len(asked):
            raise SecAggInputError(f"{self._who}: a client is listed twice in active/dead")
        if self.node_id not in active:
            raise SecAggInputError(f"{self._who}: not listed among the survivors")
        if not set(asked) <= set(self._held):
            raise SecAggInputError(f"{self._who}: asked for shares of "
                                   f"{sorted(set(asked) - set(self._held))}, which it lacks")
        if len(active) < self.params.threshold:
            raise SecAggInputError(f"{self._who}: only {len(active)} survivors in its "
                                   f"neighbourhood, fewer than the threshold "
                                   f"{self.params.threshold}")
        if self._u3 is not None:
            self._checked(active, dead, msg)
        reveal = wire.get_int_list(msg, wire.REVEAL, self._who) if wire.REVEAL in msg else []
        masked_with = set(self._held) | set(self._bad)
        if (len(set(reveal)) != len(reveal) or set(reveal) & set(active)
                or not set(reveal) <= masked_with - {self.node_id}):
            raise SecAggInputError(f"{self._who}: asked to reveal its mask keys with {reveal}: "
                                   f"only distinct neighbours it masked with, none a survivor")
        shares = [self._held[n][0] for n in active] + [self._held[n][1] for n in dead]
        self._next = DONE
        out = {wire.STAGE: Stage.UNMASK, wire.NIDS: asked, wire.SHARES: shares}
        if reveal:  # the masks it added with reported clients: what their mask keys would give
            out[wire.REVEAL] = reveal
            out[wire.PAIR_KEYS] = [pairwise_key(self._sk1, self._pk1s[j]) for j in reveal]
        return out

    # ------------------------------------------------------------ the node's private state
    def to_record(self) -> dict[str, Any]:
        """This client's private state as ConfigRecord values, to keep in the node's own
        ``context.state`` between messages (a deployment may run each in a fresh process);
        never sent. After the unmask stage only the fact that it is done is kept."""
        out: dict[str, Any] = {"node-id": self.node_id, "next": self._next}
        if self._next in (Stage.SETUP, DONE):
            return out
        out.update({"run-id": self.run_id, "round": self.server_round})
        out.update(self.params.to_config())
        out.update({"sizes": list(self.sizes), "sk1": private_key_to_bytes(self._sk1),
                    "sk2": private_key_to_bytes(self._sk2), "pk1": self._pk1,
                    "pk2": self._pk2})
        if self._next == Stage.SHARE_KEYS:
            return out
        out.update({"pk1s-ids": list(self._pk1s), "pk1s": list(self._pk1s.values()),
                    "seed": self._seed, "enc-ids": list(self._enc_keys),
                    "enc-keys": list(self._enc_keys.values()), "held-ids": list(self._held),
                    "held-seeds": [v[0] for v in self._held.values()],
                    "held-sk1s": [v[1] for v in self._held.values()]})
        out["bad-ids"] = list(self._bad)  # the next stage is the check or unmask
        if self._u3 is not None:
            out["survivors"] = list(self._u3)
        return out

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], trust: KeyTrust | None = None
                    ) -> SecAggClient:
        """The client ``to_record`` saved (a stored state that does not parse is refused),
        with the device's ``trust`` (never stored: it is the device's, read each time)."""
        who = "secagg client state"
        try:
            client = cls(int(rec["node-id"]), trust, int(rec.get("run-id", 0)),
                         int(rec.get("round", 0)))
            client._next = str(rec["next"])
            if client._next not in (*_ORDER, DONE):
                raise SecAggInputError(f"{who}: stage {client._next!r} is not a stage")
            if client._next in (Stage.SETUP, DONE):
                return client
            client.params = SecAggParams.from_config(rec)
            client.sizes = wire.get_int_list(rec, "sizes", who)
            client._sk1 = bytes_to_private_key(wire.get_bytes(rec, "sk1", who))
            client._sk2 = bytes_to_private_key(wire.get_bytes(rec, "sk2", who))
            client._pk1 = wire.get_bytes(rec, "pk1", who)
            client._pk2 = wire.get_bytes(rec, "pk2", who)
            if client._next == Stage.SHARE_KEYS:
                return client
            ids = wire.get_int_list(rec, "pk1s-ids", who)
            client._pk1s = dict(zip(ids, wire.get_bytes_list(rec, "pk1s", who, len(ids)),
                                    strict=True))
            client._seed = wire.get_bytes(rec, "seed", who)
            ids = wire.get_int_list(rec, "enc-ids", who)
            client._enc_keys = dict(zip(ids, wire.get_bytes_list(rec, "enc-keys", who,
                                                                 len(ids)), strict=True))
            ids = wire.get_int_list(rec, "held-ids", who)
            client._held = dict(zip(ids, zip(
                wire.get_bytes_list(rec, "held-seeds", who, len(ids)),
                wire.get_bytes_list(rec, "held-sk1s", who, len(ids)), strict=True),
                strict=True))
            client._bad = (wire.get_int_list(rec, "bad-ids", who) if "bad-ids" in rec
                           else [])  # a state stored before the masked input has none
            if "survivors" in rec:
                client._u3 = wire.get_int_list(rec, "survivors", who)
        except (KeyError, TypeError, ValueError) as err:
            if isinstance(err, SecAggInputError):
                raise
            raise SecAggInputError(f"{who} does not parse: {err}") from None
        return client
