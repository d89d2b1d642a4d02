"""FedCM (Xu et al. 2021): local steps along alpha * grad + (1 - alpha) * d (``fedcm-alpha``).

Server: d = -D_prev / (K * eta_prev), the previous round's aggregate update D (RI variant)
scaled to a per-step gradient, sent down as an extra ArrayRecord (zeros in round 1, and kept
when a round has no usable reply); w_{t+1} = w_t + eta_g * D. K is learned from the replies:
their ``num-steps`` averaged with the SAME weights as D (examples by default), so that D / K
is a per-step direction also when client sizes differ. (An unweighted mean K under-counts the
large clients that dominate an example-weighted D; with the unequal Dirichlet-0.1 split that
over-scaled d by about 1.7x, and d fed back into the next D at a gain above 1: FedCM fell to
chance.) Under a robust ``aggregation`` K is combined by D's rule too (the median step
count under ``median``, the picked reply's under ``krum``: ``RoundInput.combine_scalars``).
eta_prev is the local lr of the round that produced D.
Down: twice FedAvg's bytes; up: FedAvg's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedinit.methods.method import (
    ClientRule,
    ClientUpdate,
    GradientHook,
    MethodSpec,
    Params,
    RoundInput,
    ServerRule,
    ServerState,
    apply_step,
    check_range,
    gradient_hook,
    zeros_like,
)
from fedinit.methods.weights import Weights

if TYPE_CHECKING:
    import torch

MOMENTUM = "fedcm-d"
"""Down: the global momentum d (a gradient-like direction)."""


@dataclass(frozen=True)
class FedCmParams(Params):
    fedcm_alpha: float
    """alpha: the local gradient's share; 1 ignores the momentum."""

    def check(self) -> None:
        check_range("fedcm-alpha", self.fedcm_alpha, 0.0 < self.fedcm_alpha <= 1.0,
                    "0 < fedcm-alpha <= 1 (1 ignores the momentum)")


@dataclass(frozen=True)
class FedCmState(ServerState):
    d: Weights
    """The momentum d sent down next round (float32), zeros before round 1."""


class FedCmServer(ServerRule[FedCmParams, FedCmState]):
    """FedCM's server half: turns each round's D into the next round's momentum d."""

    state_type = FedCmState
    dp_refusal = ("its momentum d = -D / (K eta) divides by the clients' reported step counts "
                  "K, which depend on their data and are not privatized")

    def init(self, w0: Weights) -> FedCmState:
        return FedCmState(d=zeros_like(w0))

    def down(self, state: FedCmState) -> dict[str, Weights]:
        return {MOMENTUM: state.d}

    def update(self, state: FedCmState, w_t: Weights,
               rnd: RoundInput) -> tuple[Weights, FedCmState]:
        k = rnd.combine_scalars([u.num_steps for u in rnd.updates])  # D's rule and weights
        scale = -1.0 / (k * rnd.lr)
        d = [(scale * u.astype(np.float64)).astype(np.float32) for u in rnd.aggregate]
        return apply_step(w_t, rnd.aggregate, rnd.server_lr), FedCmState(d=d)

    def reply_problem(self, update: ClientUpdate, expected_steps: int | None) -> str | None:
        """K scales d = -D / (K eta): a client under-reporting its steps inflates it."""
        if expected_steps is not None and update.num_steps != expected_steps:
            return (f"num-steps={update.num_steps}, but partition {update.partition_id} takes "
                    f"{expected_steps} steps")
        return None


class FedCmClient(ClientRule[FedCmParams]):
    """FedCM's client half: mixes the local gradient with the server's momentum."""

    down_keys = (MOMENTUM,)

    def begin(self, start: Weights, down: Mapping[str, Weights], state: Mapping[str, Weights],
              lr: float, device: torch.device) -> GradientHook | None:
        alpha = self.params.fedcm_alpha
        return gradient_hook(device, scale=alpha,
                             shift=[(1.0 - alpha) * d for d in down[MOMENTUM]])


SPEC = MethodSpec(name="fedcm", label="FedCM", params=FedCmParams, server=FedCmServer,
                  client=FedCmClient, ri_aggregation="update",
                  async_refusal=None, secagg_refusal=None)
