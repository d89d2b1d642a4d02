"""Secure aggregation (``secure-aggregation=secagg+``): SecAgg+'s stages around a train round
(five with signed keys), so the server only ever holds the SUM of the round's uploads
(``fedinit/secure_aggregation/``, docs/algorithms.md, "Secure aggregation").

``SecAggRound.key_exchange`` runs in ``configure_train`` (Flower 1.39 hands it the grid): the
setup and share-keys stages as two QUERY exchanges with the sampled clients, then each train
message carries the ciphertexts addressed to its client. Each train reply carries the client's
masked upload (its model delta, w_iK - w_t or Delta_i, then each extra upload of the method
in ``upload_keys`` order, e.g. SCAFFOLD's Delta_c_i: one vector of arrays, clipped, quantised
and masked) in place of plain arrays. ``SecureSum``, a pipeline stage after decoding and the
quorum, runs the unmask exchange with the survivors (with signed keys preceded by the
consistency check, one more QUERY exchange: ``SecAggRound.checked``), splits the
dequantised sum into the model's and each extra's, and sets the round's aggregate D to the
model sum divided by their number (uniform weighting) and ``sums`` to the sums themselves,
which the method's server rule then uses as it would the plain mean and the plain sums
(``RoundInput.upload_sum``, ``RoundInput.extra_sum``). Protocol ids are the client ids
(small ints the client knows), not Flower's node ids.

A client that drops in any stage is left out, and so is one whose protocol reply is malformed
or hostile (missing or wrong-typed keys, a public key another client also sent, shares for
clients that are not its neighbours, a ciphertext of the wrong length or one its recipient
reports it cannot open, a masked vector of the wrong size: one line each naming the client
and its node; ``SecAggServer.rejected``); more dropouts than the threshold allows
and the round has no sum: the model stays, one line is logged, and no client's state is
counted as aggregated (``AccountRound`` never runs for it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from logging import INFO, WARNING
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.weights import Weights
from fedinit.secure_aggregation import wire as sw
from fedinit.secure_aggregation.params import SecAggParams, narrowest_field
from fedinit.secure_aggregation.wire import RoundFailedError, SecAggInputError
from fedinit.secure_aggregation.wire import Stage as SecAggStage
from strategies.operator_log import log_line
from strategies.round_stages.replies import RoundReplies

if TYPE_CHECKING:
    from fedinit.secure_aggregation.server import SecAggServer

SECAGG = sw.RECORD
"""The ConfigRecord of every SecAgg+ message (the protocol's dict) and of a masked reply."""


def params_of(cfg: RunConfig) -> SecAggParams:
    """The run's protocol parameters (already range-checked by the run config): its bits
    (``RunConfig.secagg_bits``: the codec's under ``compression=qB``) and the narrowest field
    the sum of a round's sampled clients fits."""
    p, bits = cfg.privacy, cfg.secagg_bits
    return SecAggParams(threshold=p.secagg_threshold, num_shares=p.secagg_num_shares,
                        clip=p.secagg_clip, bits=bits,
                        field_bits=narrowest_field(bits, cfg.sampled_per_round))


def upload_keys(up_keys: Sequence[str]) -> tuple[str, ...]:
    """The order of a masked upload's vectors after the model's: the method's extra uploads
    by name (the client sorts the same names of its reply)."""
    return tuple(sorted(up_keys))


def masked_problem(content: RecordDict, w_t: Weights, extras: int, width: int) -> str | None:
    """Why a train reply's content is not a well-formed masked upload, or None: no plain
    ArrayRecord at all, and one byte string of ``width``-byte little-endian field elements
    (``SecAggParams.field_bits``) per model array, for the model and for each of the
    method's ``extras`` extra uploads."""
    if content.array_records:
        return (f"the reply carries plain arrays {sorted(content.array_records)} under secure "
                f"aggregation (only the masked upload may leave a client)")
    if SECAGG not in content.config_records:
        return f"missing ConfigRecord {SECAGG!r} (the masked upload)"
    rec = content.config_records[SECAGG]
    if rec.get(sw.STAGE) != SecAggStage.COLLECT:
        return f"{SECAGG!r} stage is {rec.get(sw.STAGE)!r}, expected {SecAggStage.COLLECT!r}"
    blobs = rec.get(sw.MASKED)
    refs = list(w_t) * (1 + extras)
    if not isinstance(blobs, list) or len(blobs) != len(refs) or not all(
            isinstance(b, bytes) for b in blobs):
        return f"{SECAGG!r} must hold {len(refs)} masked arrays as bytes"
    for i, (blob, ref) in enumerate(zip(blobs, refs, strict=True)):
        if len(blob) != width * ref.size:
            return f"masked array {i} has {len(blob)} bytes, expected {width * ref.size}"
    return None


@dataclasses.dataclass
class SecAggRound:
    """The protocol's server half for the round in flight, from ``configure_train`` (key
    exchange) to ``SecureSum`` (unmask), and the grid it talks over."""

    params: SecAggParams
    timeout: float | None = None
    extra_keys: tuple[str, ...] = ()
    """The method's extra uploads, masked after the model in this order (``upload_keys``)."""
    server: SecAggServer | None = None
    grid: Grid | None = None
    server_round: int = 0
    node_of: dict[int, int] = dataclasses.field(default_factory=dict)
    """Client id -> node id of this round's participants."""
    logged: int = 0
    """How many of the server's ``rejected`` replies are logged already."""
    private: bool = False
    """Under ``dp=distributed`` the sample is secret: the protocol's lines (which client
    dropped, how many signed) go to the operator's file (``strategies.operator_log``)."""

    def log_rejected(self, server: SecAggServer) -> None:
        """One line per protocol reply the server refused since the last call: that client
        is dropped from the protocol, the round goes on without it."""
        for cid, stage, why in server.rejected[self.logged:]:
            log_line(self.private, WARNING,
                "round %d: secure aggregation: client %d (node %s) dropped at %s, "
                "its reply is rejected: %s", self.server_round, cid,
                self.node_of.get(cid, "?"), stage, why)
        self.logged = len(server.rejected)

    def key_exchange(self, grid: Grid, server_round: int, w_t: Weights,
                     messages: Sequence[Message], sent_to: Mapping[int, int]) -> list[Message]:
        """Setup and share keys with the clients ``messages`` go to; returns the train
        messages of those that completed both, each with its collect-stage dict; none (one
        line logged) when the round cannot have a sum."""
        self.server, self.grid, self.server_round = None, grid, server_round
        self.node_of = {cid: node for node, cid in sent_to.items()}
        self.logged = 0
        server = None
        # the protocol's server (its cryptography) loads only when a round runs SecAgg+
        from fedinit.secure_aggregation.server import SecAggServer

        try:
            server = SecAggServer(self.params, sorted(self.node_of),
                                  [tuple(a.shape) for a in w_t] * (1 + len(self.extra_keys)))
            keys = self.exchange(server.setup_messages())
            try:
                outgoing = server.share_keys_messages(keys)
                if server.sig:  # the devices' own setting: the server can only relay them
                    log_line(self.private, INFO,
                        "round %d: secure aggregation: %d of %d clients signed their "
                        "keys (relayed to their neighbours, who verify them)", server_round,
                        len(server.sig), len(server.stage_clients[SecAggStage.SETUP]))
                shared = self.exchange(outgoing)
            finally:
                self.log_rejected(server)
            collect = server.collect_messages(shared)
            self.log_rejected(server)
        except (RoundFailedError, SecAggInputError) as err:
            if server is not None:
                self.log_rejected(server)
            log_line(self.private, WARNING,
                "round %d: secure aggregation: %s; no train message is sent, the "
                "global model is unchanged", server_round, err)
            return []
        self.server = server
        out = []
        for msg in messages:
            cid = sent_to[msg.metadata.dst_node_id]
            if cid in collect:
                msg.content.config_records[SECAGG] = ConfigRecord(collect[cid])
                out.append(msg)
        return out

    def checked(self, server: SecAggServer, masked: Mapping[int, Mapping[str, Any]]
                ) -> dict[int, dict[str, Any]]:
        """With signed keys, the consistency check before unmask: one more QUERY exchange
        telling each survivor U3 and collecting its signature over it; the unmask requests
        then relay every signature (a verifying device releases nothing without t)."""
        signed = self.exchange(server.check_messages(masked))
        asked = server.unmask_after_check(signed)
        log_line(self.private, INFO,
            "round %d: secure aggregation: consistency check: %d of %d survivors signed "
            "the survivor set", self.server_round,
            len(next(iter(asked.values()), {}).get(sw.SIGNERS, [])),
            len(server.stage_clients[SecAggStage.COLLECT]))
        return asked

    def exchange(self, outgoing: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
        """One protocol stage: a QUERY per client, the replies' dicts by client id. A client
        whose reply is an error, or lacks the protocol record, has dropped (logged)."""
        assert self.grid is not None
        msgs = [Message(content=RecordDict({
                    SECAGG: ConfigRecord(dict(body)),
                    rk.CONFIG: ConfigRecord({rk.CLIENT_ID: cid, rk.ROUND: self.server_round})}),
                    message_type=MessageType.QUERY, dst_node_id=self.node_of[cid])
                for cid, body in outgoing.items()]
        client_of = {node: cid for cid, node in self.node_of.items()}
        got: dict[int, dict[str, Any]] = {}
        for reply in self.grid.send_and_receive(msgs, timeout=self.timeout):
            node = reply.metadata.src_node_id
            cid = client_of.get(node)
            if cid is None or cid not in outgoing:
                continue
            if reply.has_error():
                why = "client error: " + (reply.error.reason.strip().splitlines() or [""])[-1]
            elif SECAGG not in reply.content.config_records:
                why = f"the reply lacks ConfigRecord {SECAGG!r}"
            else:
                got[cid] = dict(reply.content.config_records[SECAGG])
                continue
            log_line(self.private, WARNING,
                "round %d: secure aggregation: client %d (node %d) dropped: %s",
                self.server_round, cid, node, why)
        return got


@dataclasses.dataclass(frozen=True)
class SecureSum:
    """The unmask stage: D = (sum of the survivors' model uploads) / (their number; under
    ``dp=distributed`` the fixed clients per round), or the round halted (no sum, one line
    logged). Sets ``weights`` (uniform), ``aggregate`` and ``sums`` (the model's sum under
    ``rk.ARRAYS``, each extra upload's under its name); the server never sees a final
    model, so ``finals`` stays empty."""

    session: SecAggRound
    denominator: int = 0
    """Under ``dp=distributed``: m, the FIXED clients per round (as ``central``: a dropout
    changes the sum, never the denominator); 0: the survivors' number."""
    min_survivors: int = 1
    """Under ``dp=distributed``: t_min (``min-replies``). A sum of fewer uploads carries less
    than the accounted noise, so it is never unmasked (the quorum stage before this one
    halts such a round already; this holds the bound whatever stage order)."""

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        server, self.session.server = self.session.server, None  # one unmask per key exchange
        if server is None:
            log_line(self.session.private, WARNING,
                "round %d: secure aggregation: no key exchange completed; the global "
                "model is unchanged", replies.server_round)
            return dataclasses.replace(replies, halted=True)
        survivors = {node for node, _ in replies.accepted}
        masked = {replies.sent_to[msg.metadata.src_node_id]:
                  dict(msg.content.config_records[SECAGG])
                  for msg in replies.messages if msg.metadata.src_node_id in survivors}
        if len(masked) < self.min_survivors:
            log_line(self.session.private, WARNING,
                "round %d: secure aggregation: %d uploads < t_min=%d (min-replies): "
                "the sum would carry less than the accounted noise; nothing is unmasked, the "
                "global model is unchanged", replies.server_round, len(masked),
                self.min_survivors)
            return dataclasses.replace(replies, halted=True)
        try:
            try:
                asked = (self.session.checked(server, masked) if server.checks
                         else server.unmask_messages(masked))
            finally:
                self.session.log_rejected(server)
            uploaded = server.stage_clients[SecAggStage.COLLECT]  # a malformed upload: dropped
            if len(uploaded) < self.min_survivors:
                raise RoundFailedError(f"{len(uploaded)} well-formed uploads < t_min="
                                       f"{self.min_survivors} (min-replies): nothing is unmasked")
            total = server.aggregate(self.session.exchange(asked))
            self.session.log_rejected(server)
        except (RoundFailedError, SecAggInputError) as err:
            self.session.log_rejected(server)
            log_line(self.session.private, WARNING,
                "round %d: secure aggregation: %s; the global model is unchanged",
                replies.server_round, err)
            return dataclasses.replace(replies, halted=True)
        kept = set(uploaded)
        accepted = tuple(a for a in replies.accepted if replies.sent_to[a[0]] in kept)
        reported = set(server.reported)
        dropped = tuple((node, "secure aggregation: its encrypted shares did not open at a "
                         "neighbour" if replies.sent_to[node] in reported else
                         "secure aggregation: its masked upload is malformed")
                        for node, _ in replies.accepted if replies.sent_to[node] not in kept)
        n, k = len(uploaded), len(replies.w_t)
        keys = (rk.ARRAYS, *self.session.extra_keys)
        sums = {key: [a.astype(np.float64) for a in total[i * k:(i + 1) * k]]
                for i, key in enumerate(keys)}
        mean = [(s / (self.denominator or n)).astype(np.float32) for s in sums[rk.ARRAYS]]
        return dataclasses.replace(replies, accepted=accepted, weights=(1.0,) * n,
                                   aggregate=mean, finals=(), sums=sums,
                                   rejected=replies.rejected + len(dropped),
                                   rejections=(*replies.rejections, *dropped))
