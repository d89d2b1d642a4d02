"""One client participation as a pure function of its inputs, free of Flower's plumbing.

``train_fn`` reads the message and context and calls ``client_round``; tests call it directly
with any model, data and loss (e.g. a least-squares problem whose optimum is known), so the
code they check is the code that runs in a deployment. It is the client half a user's
ClientApp calls (``strategies.client.participate``) with the project's run config filled in:
its SGD pass (``client_app/trainer.py``), its DP release, its seed and client id.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn

from client_app.trainer import LossFn, SgdSettings, sgd_pass, train_losses
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.dp import Mechanism
from fedinit.methods.method import ClientRule, SgdPass
from fedinit.store.client_store import ClientStore
from strategies.client import participate
from strategies.device_privacy import train_metrics


def client_round(
    cfg: RunConfig,
    rule: ClientRule,
    received: RecordDict,
    state: ClientStore,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    initial: Callable[[], Sequence[np.ndarray]],
    partition_id: int,
    loss_fn: LossFn = nn.functional.cross_entropy,
    timed: Callable[[float], None] | None = None,
) -> RecordDict:
    """Train from the RI start point with ``rule.train``, update ``state``, return the reply
    (``strategies.client.participate`` on the run's SGD pass; no figure under local DP).

    ``initial`` gives w_0 (the RI w_prev before a first participation); it is called only
    then, so a deployment does not rebuild the initial model on every message. ``timed``
    is handed the local training's seconds (the reply's ``compute-seconds``, also under
    local DP where the reply withholds them): a node's ``slowdown`` stretches by it.
    """
    def make_sgd(server_round: int, lr: float) -> SgdPass:
        return sgd_pass(model, x, y, SgdSettings(
            epochs=cfg.train.local_epochs, batch_size=cfg.train.batch_size, lr=lr,
            weight_decay=cfg.train.weight_decay, clip_norm=cfg.train.clip_norm, seed=cfg.seed,
            server_round=server_round, partition_id=partition_id), loss_fn)

    content = participate(rule, received, state, make_sgd, next(model.parameters()).device,
                          initial=initial, release=Mechanism.from_config(cfg).release,
                          losses=train_losses(model, x, y, cfg.train.batch_size, loss_fn),
                          seed=cfg.seed, client_id=partition_id, timed=timed)
    if cfg.privacy.dp == "local":  # each figure depends on the device's data: none leaves
        content.metric_records[rk.METRICS] = train_metrics(True, {})
    return content
