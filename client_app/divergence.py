"""The client's part of the paper's all-client divergence term: ||w_prev_i - w^t||^2.

w_prev_i is the client's stored final local model of its last participation (RI's w_prev;
w_0 before its first, which is what RI would start it from). The state is read from a
snapshot of the store: measuring never changes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from flwr.app import MetricRecord, RecordDict

from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.store.client_store import W_PREV, ClientStore


def divergence_to_global(received: RecordDict, store: ClientStore,
                         initial: Callable[[], Sequence[np.ndarray]]) -> MetricRecord:
    """The reply's metrics: the squared distance (float64) and whether w_prev was trained."""
    conf = received.config_records[rk.CONFIG]
    server_round, experiment = int(conf[rk.ROUND]), str(conf.get(rk.EXPERIMENT, ""))
    w_t = unpack(received.array_records[rk.ARRAYS])
    store.restore(experiment, server_round + 1, w_t)
    w_prev = store.get(W_PREV)
    trained = w_prev is not None
    own = w_prev if w_prev is not None else list(initial())
    sq = sum(float(np.sum((p.astype(np.float64) - w.astype(np.float64)) ** 2))
             for p, w in zip(own, w_t, strict=True))
    return MetricRecord({rk.SQ_DISTANCE: sq, rk.HAS_TRAINED: int(trained)})
