"""The ClientApp: one SuperNode is one client, identified by its ``partition-id`` (or, for a
node with its own data, by the client id the server's node registry gives it).

train: restore state -> RI start point -> the method's local rule -> store state -> reply.
query: tell the server who this node is (partition id), so sampling is by client, not node.
evaluate: personalized evaluation on this client's local test split (``personal_accuracy.py``),
federated evaluation (the received model on the local test split), or the received model's
accuracy on its training data.
With ``dataset=device`` the client's data is what its node holds (node config ``data-dir``);
data that does not meet the run's schema fails the task with one line naming the file.
Privacy is the device's (``device_privacy.py``): its node config sets a local-DP floor that
no run config lowers; under local DP it answers no evaluate message and reports no train
metric, and counts each release in its own ledger. Its disk is its own too
(``state_place.py``): a task that would name a place on it, or lead outside its state
directory, is refused before any work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app.divergence import divergence_to_global
from client_app.model_cache import (
    cached_model,
    client_tensors,
    client_test_tensors,
    initial_weights,
)
from client_app.personal_accuracy import personal_evaluation
from client_app.round import client_round
from client_app.secagg_trust import TrustError, fresh_round, trust_of
from client_app.state_place import state_dir_of
from fedinit.config import RunConfig
from fedinit.flower_compat import install
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import shapes, unpack
from fedinit.methods.upload_codec import OFF, residual_keys
from fedinit.node import slowdown
from fedinit.secure_aggregation import SecAggInputError, Stage
from fedinit.secure_aggregation import wire as sw
from fedinit.store.client_store import ClientStore
from fedinit.store.path_names import PathError
from fedinit.store.simulated_state import STATE_ROOT
from fedinit.task.evaluation import evaluate as evaluate_model
from fedinit.task.models import set_weights
from strategies.device_privacy import (
    DeviceFloor,
    DeviceRelease,
    account_release,
    admitted,
    ledger_for,
    local_dp,
    refusal,
    under_floor,
)
from strategies.secure_upload import SECAGG, mask_upload, secagg_step

install("simulation-engine")  # acts only while Flower's engine loads this, before Ray starts
app = ClientApp()


_PARSED: dict[tuple[tuple[str, Any], ...], RunConfig] = {}
"""Run configs this process has validated, by their items (a few per process at most)."""


def run_config_of(context: Context) -> RunConfig:
    """``RunConfig.parse`` of the context's run config, once per distinct run config in this
    process: a simulation worker serves every message of a run with the same mapping, and
    parsing it (every key, every method's parameters) cost 0.3 ms per message."""
    raw = context.run_config
    key = tuple(sorted(raw.items()))
    try:
        cfg = _PARSED.get(key)
    except TypeError:  # an unhashable value: let the parse name it
        return RunConfig.parse(raw)
    if cfg is None:
        cfg = RunConfig.parse(raw)
        if len(_PARSED) >= 8:
            _PARSED.clear()
        _PARSED[key] = cfg
    return cfg


def partition_of(context: Context, cfg: RunConfig, msg: Message | None = None) -> int:
    """This node's client id: its node config's ``partition-id`` (a benchmark split), else
    the client id the server put in the message (a node with its own data is the client its
    registry entry names). A message for another client than the node's partition is refused."""
    nc = context.node_config
    conf = msg.content.config_records.get(rk.CONFIG) if msg is not None else None
    sent = conf.get(rk.CLIENT_ID) if conf is not None else None
    if "partition-id" in nc:
        cid = int(nc["partition-id"])
        if sent is not None and int(sent) != cid:
            raise ValueError(f"the message is for client-id={sent}, this node holds "
                             f"partition-id={cid}: refused")
    elif sent is not None:
        cid = int(sent)
    else:
        raise ValueError(
            "node config has no 'partition-id' and the message names no client-id; start "
            "the SuperNode with --node-config \"partition-id=<i> num-partitions=<N>\" (or "
            "put its node id in the run's node-registry)"
        )
    if not 0 <= cid < cfg.num_clients:
        raise ValueError(f"client id {cid} is outside 0..{cfg.num_clients - 1}")
    return cid


def data_dir_of(context: Context) -> str:
    """The node's own data (node config ``data-dir``; device data only, else "")."""
    return str(context.node_config.get("data-dir", ""))


def client_store(context: Context, cfg: RunConfig, experiment: str, cid: int,
                 sim_root: str = "") -> ClientStore:
    """This client's store: memory is ``context.state``; disk is the node's state directory
    (node config ``state-dir``, else, for a client the server hosts, run config
    ``client-state-dir``), or none when neither is set or the server names no experiment
    (``state_place.state_dir_of``: PathError when the place is not the device's). A
    simulated client (the server names its state directory, ``sim_root``) keeps its state
    on disk only, so the simulation process holds nothing of it between participations
    (fedinit/store/simulated_state.py), and writes it without an fsync of its own: the server makes
    a round's files durable at once before its checkpoint (``server_app.experiment``)."""
    disk = state_dir_of(context.node_config, cfg, experiment, cid, sim_root)
    if disk is not None and not disk.sync:  # the simulation's state root: disk only
        return ClientStore(memory=None, disk=disk)
    return ClientStore(memory=context.state, disk=disk)


def train_fn(msg: Message, context: Context) -> Message:
    """One participation: Flower's message and context in, ``client_round`` does the work.
    The node's ``slowdown`` (``fedinit.node.slowdown``; a bad one fails the task first) sleeps
    (FACTOR - 1) x the training time after the reply is built, before it is handed back."""
    factor = slowdown.factor_of(context.node_config)
    trained: list[float] = []
    reply = train_reply(msg, context, trained.append)
    slowdown.stretch(factor, sum(trained))
    return reply


def train_reply(msg: Message, context: Context, timed: Callable[[float], None]) -> Message:
    """The train reply. A run below the device's privacy floor is refused before anything is
    read. Under local DP the release is counted in the device's ledger before the reply
    leaves, and a task that fails says only that it failed (its error's text may tell of
    the data). A place on disk that is not the device's is refused (``PathError``: its
    line names only the server's value, or a path relative to the state directory)."""
    cfg = run_config_of(context)
    return under_floor(msg, context, DeviceRelease.of_run(cfg), "train message",
                       lambda floor: Message(content=train_content(msg, context, cfg, floor,
                                                                   timed), reply_to=msg),
                       refused=(PathError,))


def train_content(msg: Message, context: Context, cfg: RunConfig,
                  floor: DeviceFloor, timed: Callable[[float], None] | None = None) -> RecordDict:
    """The reply's content; under local DP the device's ledger is read before any data
    (a damaged one stops the task) and counts the release once it is made."""
    cid = partition_of(context, cfg, msg)
    conf = msg.content.config_records[rk.CONFIG]
    server_round, experiment = int(conf[rk.ROUND]), str(conf.get(rk.EXPERIMENT, ""))
    state = client_store(context, cfg, experiment, cid, str(conf.get(STATE_ROOT, "")))
    asked = DeviceRelease.of_run(cfg)
    ledger = ledger_for(floor, context, state) if local_dp(asked, floor) else None
    # the received arrays' shapes only: client_round decodes the model, once
    accounted = conf.get(rk.ACCOUNTED_ROUND)
    fell_back = state.restore(experiment, server_round,
                              shapes(msg.content.array_records[rk.ARRAYS]),
                              None if accounted is None else int(accounted),  # type: ignore[arg-type]
                              (*cfg.spec.client.accounted_keys,  # and top-k's residuals
                               *residual_keys(str(conf.get(rk.COMPRESSION, OFF)),
                                              cfg.spec.server.up_keys)))
    x, y = client_tensors(cfg, cid, data_dir_of(context))
    content = client_round(cfg, cfg.spec.client(cfg.params), msg.content, state,
                           cached_model(cfg), x, y, initial=lambda: initial_weights(cfg),
                           partition_id=cid, timed=timed)
    if cfg.privacy.secure_aggregation != "off":  # the plain upload never leaves: only masked
        content = mask_upload(msg.content, content, context.state, cid)
    else:  # under secure aggregation no per-client figure leaves (secure_upload)
        content.metric_records[rk.METRICS][rk.STATE_FALLBACK] = int(fell_back)
    if ledger is not None:  # one noised channel per upload (masked ones too), at the device's
        account_release(ledger, msg, asked.multiplier, asked.channels)  # own multiplier
    state.save(experiment, server_round, pin=rk.kept_rounds(conf))
    return content


def query_fn(msg: Message, context: Context) -> Message:
    """Identity of this node as a client: its partition id and the partition count it knows
    (-1 for a node without them: the server's node-registry names its client id). A query
    that carries a SecAgg+ stage (setup, share keys, unmask) is answered by this node's
    protocol client (``secure_upload.secagg_step``), unless the run is below the device's
    privacy floor (then refused, as its train message would be: it never joins the round)."""
    if SECAGG in msg.content.config_records:
        cfg = run_config_of(context)
        if cfg.privacy.secure_aggregation == "off":
            raise ValueError("a secure-aggregation query in a run with secure-aggregation=off: "
                             "refused")
        _, refused = device_floor(context, cfg, msg, "secure-aggregation query")
        if refused is not None:  # below the device's floor: it does not even join the round
            return refused
        return secagg_reply(msg, context, partition_of(context, cfg, msg))
    nc = context.node_config
    info = {rk.PARTITION_ID: int(nc.get("partition-id", -1)),
            rk.NUM_PARTITIONS: int(nc.get("num-partitions", -1))}
    return Message(content=RecordDict({rk.CONFIG: ConfigRecord(info)}), reply_to=msg)


def secagg_reply(msg: Message, context: Context, cid: int) -> Message:
    """The protocol client's answer, under the device's own key settings (node config, not
    the run's: ``secagg_trust``); a protocol step the device refuses (unusable settings,
    keys without the signatures it requires, a second signature for one round, a malformed
    message) is one log line and that line as the error reply."""
    task = "secure-aggregation query"
    body = msg.content.config_records[SECAGG]
    conf = msg.content.config_records.get(rk.CONFIG)
    server_round = int(conf.get(rk.ROUND, 0)) if conf is not None else 0  # type: ignore[arg-type]
    try:
        trust = trust_of(context.node_config)
    except TrustError as err:
        return refusal(msg, task, str(err))
    if trust.signing_key is not None and body.get(sw.STAGE) == Stage.SETUP:
        stale = fresh_round(context.state, context.run_id, server_round)
        if stale is not None:
            return refusal(msg, task, stale)
    try:
        reply = secagg_step(body, context.state, cid, trust, context.run_id, server_round)
    except SecAggInputError as err:
        return refusal(msg, task, str(err))
    return Message(content=RecordDict({SECAGG: reply}), reply_to=msg)


def evaluate_fn(msg: Message, context: Context) -> Message:
    """Personalized evaluation when the message asks for it (``personal_accuracy``); federated
    evaluation (``federated-eval``: the received model on the local test split); otherwise
    loss and accuracy of the received model on this client's training data. Never changes
    the client's state. Under local DP every one of them is refused: each is an exact
    answer about the device's data or state; under secure aggregation too (each is a
    per-client figure, and the server of such a run may learn only sums)."""
    cfg = run_config_of(context)
    conf = msg.content.config_records.get(rk.CONFIG)
    task = f"evaluate message ({evaluation_kind(conf)})"
    floor, refused = device_floor(context, cfg, msg, task)
    if refused is not None:
        return refused
    if local_dp(DeviceRelease.of_run(cfg), floor):
        return refusal(msg, task, "under local DP this device answers no exact query about "
                                  "its data or state")
    if cfg.privacy.secure_aggregation != "off":  # its scores would tell the server what sums hide
        return refusal(msg, task, "under secure-aggregation="
                                  f"{cfg.privacy.secure_aggregation!r} this "
                                  "device sends no per-client evaluation (the server learns "
                                  "only sums)")
    cid = partition_of(context, cfg, msg)
    data_dir = data_dir_of(context)
    if conf is not None and conf.get(rk.FEDERATED_EVAL):
        return Message(content=RecordDict({rk.METRICS: federated_evaluation(
            cfg, msg, client_test_tensors(cfg, cid, data_dir))}), reply_to=msg)
    if conf is not None and (conf.get(rk.DIVERGENCE_EVAL) or conf.get(rk.PERSONAL_EVAL)):
        try:
            return Message(content=RecordDict({rk.METRICS: state_evaluation(
                cfg, msg, context, conf, cid)}), reply_to=msg)
        except PathError as err:
            return refusal(msg, task, str(err))
    model = cached_model(cfg)
    set_weights(model, unpack(msg.content.array_records[rk.ARRAYS]))
    x, y = client_tensors(cfg, cid, data_dir)
    loss, acc = evaluate_model(model, x, y)
    metrics = MetricRecord({rk.EVAL_LOSS: loss, rk.EVAL_ACC: acc, rk.NUM_EXAMPLES: len(y)})
    return Message(content=RecordDict({rk.METRICS: metrics}), reply_to=msg)


def state_evaluation(cfg: RunConfig, msg: Message, context: Context, conf: ConfigRecord,
                     cid: int) -> MetricRecord:
    """Divergence or personalized evaluation: both read the client's stored state, from the
    device's own place only (PathError otherwise)."""
    snapshot = client_store(context, cfg, str(conf.get(rk.EXPERIMENT, "")), cid,
                            str(conf.get(STATE_ROOT, ""))).snapshot()
    if conf.get(rk.DIVERGENCE_EVAL):
        return divergence_to_global(msg.content, snapshot, lambda: initial_weights(cfg))
    data_dir = data_dir_of(context)
    return personal_evaluation(cfg, cfg.spec.client(cfg.params), msg.content, snapshot,
                               cached_model(cfg), client_tensors(cfg, cid, data_dir),
                               client_test_tensors(cfg, cid, data_dir), partition_id=cid)


def device_floor(context: Context, cfg: RunConfig, msg: Message,
                 task: str) -> tuple[DeviceFloor, Message | None]:
    """The node's privacy floor, and the refusal of ``task`` when the node's privacy
    settings are unusable or the run asks for less than they allow (else None)."""
    return admitted(msg, context, DeviceRelease.of_run(cfg), task)


def evaluation_kind(conf: ConfigRecord | None) -> str:
    """Which evaluation an evaluate message asks for, by its flag (for log lines)."""
    for key, kind in ((rk.FEDERATED_EVAL, "federated evaluation"),
                      (rk.DIVERGENCE_EVAL, "divergence"),
                      (rk.PERSONAL_EVAL, "personalized evaluation")):
        if conf is not None and conf.get(key):
            return kind
    return "evaluation"


def federated_evaluation(cfg: RunConfig, msg: Message,
                         test: tuple[torch.Tensor, torch.Tensor]) -> MetricRecord:
    """The received (global) model's loss and accuracy on the local test split, and its
    size: the server's example-weighted mean is the run's accuracy curve. Only the size
    when the split is empty."""
    x, y = test
    metrics: dict[str, int | float] = {rk.NUM_TEST: len(y)}
    if len(y):
        model = cached_model(cfg)
        set_weights(model, unpack(msg.content.array_records[rk.ARRAYS]))
        metrics[rk.EVAL_LOSS], metrics[rk.EVAL_ACC] = evaluate_model(model, x, y)
    return MetricRecord(metrics)


app.train()(train_fn)
app.query()(query_fn)
app.evaluate()(evaluate_fn)
