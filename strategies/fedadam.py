"""FedAdam (Reddi et al. 2021): server-side Adam on the round's aggregate update D.

m <- b1 * m + (1 - b1) * D;  v <- b2 * v + (1 - b2) * D^2;  w <- w + eta_g * m / (sqrt(v) + eps),
without bias correction, as in the authors' simulator (keys ``adam-beta1``, ``adam-beta2``,
``adam-eps``). D is the RI-variant aggregate update, so FedAdam + RI needs nothing extra.
The paper runs FedAdam with eta_g = 0.1, which is what the default ``server-lr=0`` means for it.
Flower's own FedAdam applies bias correction and cannot use D, hence this small rewrite.
Clients run plain local SGD; the wire cost is FedAvg's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import RecordDict

from strategies.base import ClientRule, RIStrategy
from strategies.ri import Weights

if TYPE_CHECKING:
    from task.config import RunConfig


class FedAdamServer(RIStrategy):
    """FedAdam's server half: Adam moments m, v kept on the strategy (zeros at start)."""

    state_attrs = ("m", "v")

    def __init__(self, cfg: RunConfig, node_of_partition: Mapping[int, int]) -> None:
        super().__init__(cfg, node_of_partition)
        self.m: Weights = []
        self.v: Weights = []

    def server_step(
        self, server_round: int, w_t: Weights, update: Weights, replies: list[RecordDict]
    ) -> Weights:
        c = self.cfg
        if not self.m:
            self.m = [np.zeros(w.shape, dtype=np.float64) for w in w_t]
            self.v = [np.zeros(w.shape, dtype=np.float64) for w in w_t]
        out = []
        for i, (w, d) in enumerate(zip(w_t, update, strict=True)):
            d64 = d.astype(np.float64)
            self.m[i] = c.adam_beta1 * self.m[i] + (1.0 - c.adam_beta1) * d64
            self.v[i] = c.adam_beta2 * self.v[i] + (1.0 - c.adam_beta2) * d64**2
            step = c.server_lr * self.m[i] / (np.sqrt(self.v[i]) + c.adam_eps)
            out.append((w.astype(np.float64) + step).astype(np.float32))
        return out


class FedAdamClient(ClientRule):
    """FedAdam's client half: plain local SGD (the method lives on the server)."""
