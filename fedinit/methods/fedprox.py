"""FedProx (Li et al. 2020): local objective f_i(w) + (mu/2) * ||w - s_i||^2, mu = ``prox-mu``.

The proximal gradient mu * (w - s_i) is added before clipping (the authors fold mu * w into the
weight decay, applied after clipping; with clipping off the two agree). Under RI the proximal
centre is the client's start point s_i. The server half is FedAvg's; the wire cost is FedAvg's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedinit.methods.fedavg import FedAvgServer
from fedinit.methods.method import (
    ClientRule,
    GradientHook,
    MethodSpec,
    Params,
    check_pull,
    check_range,
    proximal_hook,
)
from fedinit.methods.weights import Weights

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class FedProxParams(Params):
    prox_mu: float
    """mu: the proximal weight; 0 turns FedProx into FedAvg."""

    def check(self) -> None:
        check_range("prox-mu", self.prox_mu, self.prox_mu >= 0, "a number >= 0 (0 disables it)")

    def check_with_lr(self, lr: float) -> None:
        check_pull("prox-mu", self.prox_mu, lr)


class FedProxClient(ClientRule[FedProxParams]):
    """FedProx's client half: the proximal gradient term, centred on the start point."""

    def begin(self, start: Weights, down: Mapping[str, Weights], state: Mapping[str, Weights],
              lr: float, device: torch.device) -> GradientHook | None:
        return proximal_hook(start, self.params.prox_mu, device)


SPEC = MethodSpec(name="fedprox", label="FedProx", params=FedProxParams, server=FedAvgServer,
                  client=FedProxClient, ri_aggregation="model",
                  async_refusal=None, secagg_refusal=None)
