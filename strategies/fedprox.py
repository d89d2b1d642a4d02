"""FedProx (Li et al. 2020): local objective f_i(w) + (mu/2) * ||w - s_i||^2, mu = ``prox-mu``.

The proximal gradient mu * (w - s_i) is added before clipping (the authors fold mu * w into the
weight decay, applied after clipping; with clipping off the two agree). Under RI the proximal
centre is the client's start point s_i. The server half is FedAvg's; the wire cost is FedAvg's.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from strategies.base import ClientRule, GradientHook, RIStrategy
from strategies.ri import Weights


class FedProxServer(RIStrategy):
    """FedProx's server half: FedAvg's aggregation (the method lives on the client)."""


class FedProxClient(ClientRule):
    """FedProx's client half: the proximal gradient term."""

    def begin(
        self,
        start: Weights,
        down: Mapping[str, Weights],
        state: Mapping[str, Weights],
        lr: float,
        device: torch.device,
    ) -> GradientHook | None:
        mu = self.cfg.prox_mu
        if mu == 0.0:
            return None
        s = [torch.from_numpy(a).to(device) for a in start]

        def hook(params: list[torch.Tensor]) -> None:
            for p, si in zip(params, s, strict=True):
                g = p.grad
                assert g is not None
                g.add_(p.detach() - si, alpha=mu)

        return hook
