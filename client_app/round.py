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
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from torch import nn

from client_app.trainer import LossFn, local_sgd
from store.client_store import W_PREV, ClientStore
from strategies import records as rk
from strategies.dp import Mechanism
from strategies.method import ClientRule
from strategies.ri import relaxed_start, upload_vector
from task.config import RunConfig
from task.models import get_weights, set_weights

PERSONAL_STREAM = 1
"""``local_generator`` stream of a method's personal pass (Ditto's v_i)."""


def local_generator(seed: int, server_round: int, partition_id: int,
                    stream: int = 0) -> torch.Generator:
    """The shuffling generator of one participation, seeded by (seed, round, client) and, for
    a second pass or fine-tuning, a stream number (0, the global pass, keeps the old seeds)."""
    words = [seed, server_round, partition_id] + ([stream] if stream else [])
    state = np.random.SeedSequence(words).generate_state(1)[0]
    return torch.Generator().manual_seed(int(state))


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
) -> RecordDict:
    """Train from the RI start point with ``rule``, update ``state``, return the reply content.

    ``initial`` gives w_0 (the RI w_prev before a first participation); it is called only
    then, so a deployment does not rebuild the initial model on every message.
    """
    conf = received.config_records[rk.CONFIG]
    server_round, lr, beta = int(conf[rk.ROUND]), float(conf[rk.LR]), float(conf[rk.BETA])
    delta = bool(conf[rk.UPLOAD_DELTA])
    w_t = received.array_records[rk.ARRAYS].to_numpy_ndarrays()

    w_prev = state.get(W_PREV) or list(initial())
    start = relaxed_start(w_t, w_prev, beta)
    method_state = {k: state.get(k) or [np.zeros_like(a) for a in w_t] for k in rule.state_keys}
    down = {k: received.array_records[k].to_numpy_ndarrays() for k in rule.down_keys}

    t0 = time.perf_counter()
    set_weights(model, start)
    hook = rule.begin(start, down, method_state, lr, next(model.parameters()).device)
    result = local_sgd(model, x, y, epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=lr,
                       weight_decay=cfg.weight_decay, clip_norm=cfg.clip_norm,
                       generator=local_generator(cfg.seed, server_round, partition_id),
                       hook=hook, loss_fn=loss_fn, sam_rho=rule.sam_rho)
    final = get_weights(model)
    new_state, extras = rule.finish(start, final, result.num_steps, lr, down, method_state)
    if rule.personal_key:
        v_start, v_hook = rule.personal_begin(w_t, state.get(rule.personal_key), lr,
                                              next(model.parameters()).device)
        set_weights(model, v_start)
        local_sgd(model, x, y, epochs=cfg.local_epochs, batch_size=cfg.batch_size, lr=lr,
                  weight_decay=cfg.weight_decay, clip_norm=cfg.clip_norm,
                  generator=local_generator(cfg.seed, server_round, partition_id,
                                            PERSONAL_STREAM),
                  hook=v_hook, loss_fn=loss_fn)
        new_state[rule.personal_key] = get_weights(model)

    state.put(W_PREV, final)
    for key, arrays in new_state.items():
        state.put(key, arrays)
    metrics = MetricRecord({rk.NUM_EXAMPLES: result.num_examples,
                            rk.TRAIN_LOSS: result.mean_loss, rk.NUM_STEPS: result.num_steps,
                            rk.COMPUTE_SECONDS: time.perf_counter() - t0})
    upload, extras = Mechanism.from_config(cfg).release(  # DP: clipped (local: noised)
        upload_vector(final, start, "update" if delta else "model"), extras)
    return RecordDict({rk.ARRAYS: ArrayRecord(upload),
                       rk.METRICS: metrics, rk.CONFIG: ConfigRecord({rk.UPLOAD_DELTA: delta}),
                       **{k: ArrayRecord(v) for k, v in extras.items()}})
