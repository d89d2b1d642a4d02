"""The ClientApp: one SuperNode is one client, identified by its ``partition-id``.

train: restore state -> RI start point -> the method's local rule -> store state -> reply.
query: tell the server who this node is (partition id), so sampling is by client, not node.
evaluate: accuracy of the received model on this client's own data.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app.model_cache import client_tensors, fresh_model, initial_weights
from client_app.state import W_PREV, ClientState
from client_app.trainer import local_sgd
from strategies import METHODS
from strategies import records as rk
from strategies.ri import relaxed_start, upload_vector
from task.config import RunConfig
from task.device import device
from task.evaluation import evaluate as evaluate_model
from task.models import get_weights, set_weights

app = ClientApp()


def partition_of(context: Context, cfg: RunConfig) -> int:
    """This node's client id from its node config, checked against num-clients."""
    nc = context.node_config
    if "partition-id" not in nc:
        raise ValueError(
            "node config has no 'partition-id'; start the SuperNode with "
            "--node-config \"partition-id=<i> num-partitions=<N>\""
        )
    pid = int(nc["partition-id"])
    if not 0 <= pid < cfg.num_clients:
        raise ValueError(f"node config partition-id={pid} is outside 0..{cfg.num_clients - 1}")
    return pid


def train_fn(msg: Message, context: Context) -> Message:
    """One participation: local training from the RI start point with the method's rule."""
    cfg = RunConfig.parse(context.run_config)
    pid = partition_of(context, cfg)
    conf = msg.content.config_records[rk.CONFIG]
    server_round, lr, beta = int(conf[rk.ROUND]), float(conf[rk.LR]), float(conf[rk.BETA])
    w_t = msg.content.array_records[rk.ARRAYS].to_numpy_ndarrays()

    state = ClientState(context.state)
    rule = METHODS[cfg.method].client(cfg)
    w_prev = state.get(W_PREV) or list(initial_weights(cfg))
    start = relaxed_start(w_t, w_prev, beta)
    zeros = [np.zeros_like(a) for a in w_t]
    method_state = {k: state.get(k) or zeros for k in rule.state_keys}
    down = {k: msg.content.array_records[k].to_numpy_ndarrays() for k in rule.down_keys}

    model = fresh_model(cfg)
    set_weights(model, start)
    hook = rule.begin(start, down, method_state, lr, device())
    x, y = client_tensors(cfg, pid)
    gen = torch.Generator().manual_seed(int(np.random.SeedSequence(
        [cfg.seed, server_round, pid]).generate_state(1)[0]))
    result = local_sgd(model, x, y, epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=lr,
                       weight_decay=cfg.weight_decay, clip_norm=cfg.clip_norm, generator=gen,
                       hook=hook)
    final = get_weights(model)
    extras = rule.finish(start, final, result.num_steps, lr, method_state)

    state.put(W_PREV, final)
    for key, arrays in method_state.items():
        state.put(key, arrays)
    metrics = MetricRecord({rk.NUM_EXAMPLES: result.num_examples,
                            rk.TRAIN_LOSS: result.mean_loss, rk.NUM_STEPS: result.num_steps})
    content = RecordDict({rk.ARRAYS: ArrayRecord(upload_vector(final, start, cfg.ri_aggregation)),
                          rk.METRICS: metrics,
                          **{k: ArrayRecord(v) for k, v in extras.items()}})
    return Message(content=content, reply_to=msg)


def query_fn(msg: Message, context: Context) -> Message:
    """Identity of this node as a client: its partition id and the partition count it knows."""
    nc = context.node_config
    info = {rk.PARTITION_ID: int(nc.get("partition-id", -1)),
            rk.NUM_PARTITIONS: int(nc.get("num-partitions", -1))}
    return Message(content=RecordDict({rk.CONFIG: ConfigRecord(info)}), reply_to=msg)


def evaluate_fn(msg: Message, context: Context) -> Message:
    """Loss and accuracy of the received model on this client's own partition."""
    cfg = RunConfig.parse(context.run_config)
    pid = partition_of(context, cfg)
    model = fresh_model(cfg)
    set_weights(model, msg.content.array_records[rk.ARRAYS].to_numpy_ndarrays())
    x, y = client_tensors(cfg, pid)
    loss, acc = evaluate_model(model, x, y)
    metrics = MetricRecord({"eval-loss": loss, "eval-acc": acc, rk.NUM_EXAMPLES: len(y)})
    return Message(content=RecordDict({rk.METRICS: metrics}), reply_to=msg)


app.train()(train_fn)
app.query()(query_fn)
app.evaluate()(evaluate_fn)
