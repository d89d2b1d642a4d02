"""FedAdam (Reddi et al. 2021): server-side Adam on the round's aggregate update D.

m <- b1 * m + (1 - b1) * D;  v <- b2 * v + (1 - b2) * D^2;  w <- w + eta_g * m / (sqrt(v) + eps),
without bias correction, as in the authors' simulator (keys ``adam-beta1``, ``adam-beta2``,
``adam-eps``). D is the RI-variant aggregate update, so FedAdam + RI needs nothing extra.
The paper runs FedAdam with eta_g = 0.1, which is what the default ``server-lr=0`` means for it.
Flower's own FedAdam applies bias correction and cannot use D, hence this small rewrite.
Clients run plain local SGD; the wire cost is FedAvg's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedinit.methods.method import (
    ClientRule,
    MethodSpec,
    Params,
    RoundInput,
    ServerRule,
    ServerState,
    check_range,
    zeros_like,
)
from fedinit.methods.weights import Weights


@dataclass(frozen=True)
class FedAdamParams(Params):
    adam_beta1: float
    adam_beta2: float
    adam_eps: float

    def check(self) -> None:
        for key, value in (("adam-beta1", self.adam_beta1), ("adam-beta2", self.adam_beta2)):
            check_range(key, value, 0.0 <= value < 1.0, f"0 <= {key} < 1")
        check_range("adam-eps", self.adam_eps, self.adam_eps > 0, "a number > 0")


@dataclass(frozen=True)
class FedAdamState(ServerState):
    m: Weights
    """First moment of D (float64), zeros before round 1."""
    v: Weights
    """Second moment of D (float64), zeros before round 1."""


class FedAdamServer(ServerRule[FedAdamParams, FedAdamState]):
    """FedAdam's server half: the Adam step on D."""

    state_type = FedAdamState

    def init(self, w0: Weights) -> FedAdamState:
        return FedAdamState(m=zeros_like(w0, np.float64), v=zeros_like(w0, np.float64))

    def update(self, state: FedAdamState, w_t: Weights,
               rnd: RoundInput) -> tuple[Weights, FedAdamState]:
        b1, b2, eps = self.params.adam_beta1, self.params.adam_beta2, self.params.adam_eps
        m, v, out = [], [], []
        for w, d, m_i, v_i in zip(w_t, rnd.aggregate, state.m, state.v, strict=True):
            d64 = d.astype(np.float64)
            m.append(b1 * m_i + (1.0 - b1) * d64)
            v.append(b2 * v_i + (1.0 - b2) * d64**2)
            step = rnd.server_lr * m[-1] / (np.sqrt(v[-1]) + eps)
            out.append((w.astype(np.float64) + step).astype(np.float32))
        return out, FedAdamState(m=m, v=v)


class FedAdamClient(ClientRule[FedAdamParams]):
    """FedAdam's client half: plain local SGD (the method lives on the server)."""


SPEC = MethodSpec(name="fedadam", label="FedAdam", params=FedAdamParams, server=FedAdamServer,
                  client=FedAdamClient, ri_aggregation="update", server_lr=0.1,
                  async_refusal=None, secagg_refusal=None)
