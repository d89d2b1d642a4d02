"""One client participation as a pure function of its inputs, free of Flower's plumbing.

``train_fn`` reads the message and context and calls ``client_round``; tests call it directly
with any model, data and loss (e.g. a least-squares problem whose optimum is known), so the
code they check is the code that runs in a deployment.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn

from client_app.trainer import LossFn, SgdSettings, sgd_pass, train_losses
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.dp import Mechanism
from fedinit.methods.method import ClientRule, LocalJob
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.ri import relaxed_start, upload_vector
from fedinit.methods.upload_codec import OFF, encode_reply
from fedinit.store.client_store import W_PREV, ClientStore
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
    """Train from the RI start point with ``rule.train``, update ``state``, return the reply.

    ``initial`` gives w_0 (the RI w_prev before a first participation); it is called only
    then, so a deployment does not rebuild the initial model on every message. ``timed``
    is handed the local training's seconds (the reply's ``compute-seconds``, also under
    local DP where the reply withholds them): a node's ``slowdown`` stretches by it.
    """
    conf = received.config_records[rk.CONFIG]
    server_round, lr, beta = int(conf[rk.ROUND]), float(conf[rk.LR]), float(conf[rk.BETA])
    delta = bool(conf[rk.UPLOAD_DELTA])
    w_t = unpack(received.array_records[rk.ARRAYS])

    w_prev = state.get(W_PREV) or list(initial())
    start = relaxed_start(w_t, w_prev, beta)
    method_state = {k: state.get(k) or rule.initial_state(k, w_t) for k in rule.state_keys}
    down = {k: unpack(received.array_records[k]) for k in rule.down_keys}

    t0 = time.perf_counter()
    settings = SgdSettings(epochs=cfg.train.local_epochs, batch_size=cfg.train.batch_size, lr=lr,
                           weight_decay=cfg.train.weight_decay, clip_norm=cfg.train.clip_norm,
                           seed=cfg.seed, server_round=server_round, partition_id=partition_id)
    outcome = rule.train(LocalJob(w_t=w_t, start=start, down=down, state=method_state, lr=lr,
                                  device=next(model.parameters()).device,
                                  sgd=sgd_pass(model, x, y, settings, loss_fn),
                                  losses=train_losses(model, x, y, cfg.train.batch_size, loss_fn)))
    seconds = time.perf_counter() - t0
    if timed is not None:
        timed(seconds)
    trained = outcome.trained
    final = trained.final

    state.put(W_PREV, final)
    for key, arrays in outcome.state.items():
        state.put(key, arrays)
    # local DP: none (strategies.device_privacy)
    metrics = train_metrics(cfg.privacy.dp == "local", {
        rk.NUM_EXAMPLES: trained.num_examples, rk.TRAIN_LOSS: trained.mean_loss,
        rk.NUM_STEPS: trained.num_steps, rk.COMPUTE_SECONDS: seconds,
        **outcome.metrics})  # the method's own (clustered FL's cluster choice)
    upload, extras = Mechanism.from_config(cfg).release(  # DP: clipped (local: noised)
        upload_vector(final, start, "update" if delta else "model"), outcome.extras)
    records, said = encode_reply(  # then compressed, as the message asks
        str(conf.get(rk.COMPRESSION, OFF)), upload, extras, w_t=w_t, delta=delta, state=state,
        seed=cfg.seed, server_round=server_round, client_id=partition_id,
        changes={up: (key, method_state[key]) for up, key in rule.uploaded_changes.items()})
    return RecordDict({**records, rk.METRICS: metrics, rk.CONFIG: said})
