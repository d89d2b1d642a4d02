"""The client's half of secure aggregation (``secure-aggregation=secagg+``): the SecAgg+
stages the server's queries carry, and the masked upload in place of the plain one.

The protocol client's private state (key pairs, self-mask seed, the neighbours' shares it
holds) lives in the node's own ``context.state`` between messages, serialised
(``SecAggClient.to_record``), because in a deployment each message may run in a fresh
process; it is never put in a reply. What is masked is the model delta: w_iK - w_t under the
``model`` variant (the server's mean of it is avg(w_iK) - w_t, Algorithm 1's D), Delta_i
under ``update``, followed by the method's extra uploads in name order (SCAFFOLD's
Delta_c_i; ``secure_sum.upload_keys``) as one vector of arrays, each coordinate clipped to
[-secagg-clip, secagg-clip] and quantised. No per-client metric leaves either (train loss,
step and example counts, compute time: each depends on the client's data or device): the
reply's MetricRecord is empty, the server fills what it can derive itself.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, MetricRecord, RecordDict

from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.secure_aggregation import SecAggClient, Stage
from fedinit.secure_aggregation import wire as sw
from fedinit.secure_aggregation.signing import KeyTrust

SECAGG = sw.RECORD
"""The ConfigRecord of every SecAgg+ message and masked reply (``round_stages.secure_sum``)."""
STATE = "secagg-client"
"""The ConfigRecord of ``context.state`` that holds the protocol client between messages."""


def _restore(state: RecordDict, client_id: int, stage: object, trust: KeyTrust | None = None,
             run_id: int = 0, server_round: int = 0) -> SecAggClient:
    """A fresh client for the setup stage (a new round, keys signed for ``run_id`` and
    ``server_round`` when the device signs); otherwise the stored one, which must be this
    client's."""
    if stage == Stage.SETUP:
        return SecAggClient(client_id, trust, run_id, server_round)
    if STATE not in state.config_records:
        raise ValueError(f"secure aggregation: stage {stage!r} without a setup on this node")
    client = SecAggClient.from_record(state.config_records[STATE], trust)
    if client.node_id != client_id:
        raise ValueError(f"secure aggregation: the stored protocol state is client "
                         f"{client.node_id}'s, the message is for client {client_id}")
    return client


def secagg_step(msg: ConfigRecord, state: RecordDict, client_id: int,
                trust: KeyTrust | None = None, run_id: int = 0,
                server_round: int = 0) -> ConfigRecord:
    """Answer one setup / share-keys / consistency-check / unmask query; the state is saved
    before the reply. ``trust`` is the device's own (``secagg_trust``), ``run_id`` its run
    and ``server_round`` the message's: what its keys (and its survivor set) are signed for
    and its neighbours' verified against."""
    stage = msg.get(sw.STAGE)
    if stage == Stage.COLLECT:
        raise ValueError("secure aggregation: the masked-input stage comes with a train "
                         "message, not a query")
    client = _restore(state, client_id, stage, trust, run_id, server_round)
    reply = client.handle(dict(msg))
    state.config_records[STATE] = ConfigRecord(client.to_record())
    return ConfigRecord(reply)


def mask_upload(received: RecordDict, reply: RecordDict, state: RecordDict,
                client_id: int) -> RecordDict:
    """The train reply with its plain uploads replaced by one masked vector: the model delta,
    then each extra upload in name order, and its metrics by none; a train message without
    the collect stage is refused (nothing leaves in the clear)."""
    if SECAGG not in received.config_records:
        raise ValueError("secure-aggregation is on but the train message carries no "
                         f"{SECAGG!r} record: refusing to upload in the clear")
    extras = sorted(k for k in reply.array_records if k != rk.ARRAYS)
    delta = bool(reply.config_records[rk.CONFIG][rk.UPLOAD_DELTA])
    upload = unpack(reply.array_records[rk.ARRAYS])
    if not delta:  # the final model: mask its move from the received global model
        w_t = unpack(received.array_records[rk.ARRAYS])
        upload = [u.astype("float64") - w for u, w in zip(upload, w_t, strict=True)]
    for key in extras:  # the server splits the sum in this order (secure_sum.upload_keys)
        upload += unpack(reply.array_records[key])
    client = _restore(state, client_id, Stage.COLLECT)
    masked = client.handle(dict(received.config_records[SECAGG]), upload)
    state.config_records[STATE] = ConfigRecord(client.to_record())
    out = RecordDict({k: v for k, v in reply.config_records.items()})
    out[rk.METRICS] = MetricRecord({})  # per-client figures would leak what the sum hides
    out[SECAGG] = ConfigRecord(masked)
    return out
