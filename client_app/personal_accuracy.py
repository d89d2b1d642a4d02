"""Personalized evaluation, the client's side: how well this client is served.

On the client's local test split: (a) the global model w_t it was sent, (b) w_t after
``finetune-epochs`` epochs of plain local SGD on its training split, (c) its own model: the
method's personal model (Ditto's v_i) or, for every other method, RI's w_prev, the final local
model of its last participation (with beta = 0 that model is not used in training, but it is
still what the client ended its last participation with: FedAvg's stale local model).
(c) is absent for a client that has not trained yet. When the message carries the method's
group models (``rk.EVAL_CHOICES``: ``cluster-serve`` / ``relax-serve`` ``lowest-loss``), w_t of
(a) and (b) is the one with the lowest loss on the client's training split (IFCA's inference
rule: the client's own data picks its group, never its test split). Nothing is written to the
client's state: the state is read from a snapshot of the store.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import MetricRecord, RecordDict
from torch import nn

from client_app.trainer import local_generator, local_sgd, train_losses
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.method import ClientRule
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.weights import unstacked
from fedinit.store.client_store import W_PREV, ClientStore
from fedinit.task.evaluation import evaluate
from fedinit.task.models import set_weights

FINETUNE_STREAM = 2
"""``local_generator`` stream of the fine-tuning pass (apart from training, 0, and a method's
own passes: Ditto's is 1)."""


def own_model_key(rule: ClientRule) -> str:
    """The state key of the client's own model: the method's personal model, else w_prev."""
    return rule.personal_key or W_PREV


def personal_evaluation(
    cfg: RunConfig,
    rule: ClientRule,
    received: RecordDict,
    store: ClientStore,
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    *,
    partition_id: int,
) -> MetricRecord:
    """The reply's metrics: accuracies (a)-(c) on ``test``; only the test count without one.

    ``store`` is restored to the state this client holds after ``server_round``; pass a
    snapshot (``ClientStore.snapshot``) so that the client's own store stays as it is.
    """
    t0 = time.perf_counter()
    conf = received.config_records[rk.CONFIG]
    server_round, lr = int(conf[rk.ROUND]), float(conf[rk.LR])
    experiment = str(conf.get(rk.EXPERIMENT, ""))
    w_t = unpack(received.array_records[rk.ARRAYS])
    x_test, y_test = test
    metrics: dict[str, int | float] = {rk.NUM_TEST: len(y_test)}
    if len(y_test) == 0:
        return MetricRecord(metrics)
    served = w_t
    if rk.EVAL_CHOICES in received.array_records and len(train[1]):
        choices = unstacked(unpack(received.array_records[rk.EVAL_CHOICES]))
        losses = train_losses(model, *train, cfg.train.batch_size)(choices)
        pick = int(np.argmin(losses))
        served, metrics[rk.SERVED_CHOICE] = choices[pick], pick
    set_weights(model, served)
    metrics[rk.ACC_GLOBAL] = evaluate(model, x_test, y_test)[1]
    local_sgd(model, *train, epochs=cfg.eval.finetune_epochs, batch_size=cfg.train.batch_size,
              lr=lr,
              weight_decay=cfg.train.weight_decay, clip_norm=cfg.train.clip_norm,
              generator=local_generator(cfg.seed, server_round, partition_id, FINETUNE_STREAM))
    metrics[rk.ACC_FINETUNED] = evaluate(model, x_test, y_test)[1]
    store.restore(experiment, server_round + 1, w_t)
    own = store.get(own_model_key(rule))
    if own is not None:
        set_weights(model, own)
        metrics[rk.ACC_OWN] = evaluate(model, x_test, y_test)[1]
    metrics[rk.COMPUTE_SECONDS] = time.perf_counter() - t0
    return MetricRecord(metrics)
