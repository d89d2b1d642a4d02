"""FedDyn (Acar et al. 2021) with alpha = ``feddyn-alpha``, composable with RI.

Client: local objective f_i(w) + alpha * <w, h_i> + (alpha/2) * ||w - s_i||^2, i.e. the gradient
g + alpha * (w - s_i) + alpha * h_i (added before clipping; the authors put alpha into the
weight decay and alpha * (h_i - s_i) into the loss: the same gradient); afterwards
h_i <- h_i + Delta_i. Server: H (the sum over ALL clients of h_j) grows by the round's
sum of Delta_i, then w_{t+1} = avg_i w_iK + H / N. Wire: the same bytes as FedAvg.

The server's view: avg_i w_iK is w_t + D under either RI aggregation (``ri.aggregate_update``);
Delta_i is the upload under ``update`` and w_iK - w_t under ``model``. The latter equals the
client's Delta_i when beta = 0; with beta != 0 and ``model`` the server cannot see s_i, so
its H drifts from sum_j h_j by beta * sum_i (w_t - w_prev_i) (use ``update`` for exact H).
The rule has no server learning rate: ``server-lr`` is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import RecordDict

from strategies import records as rk
from strategies.base import ClientRule, GradientHook, RIStrategy
from strategies.ri import Weights

if TYPE_CHECKING:
    from task.config import RunConfig

H_LOCAL = "feddyn-h-i"
"""Client state: h_i, the running sum of its own Delta_i."""


class FedDynServer(RIStrategy):
    """FedDyn's server half: keeps H = sum_j h_j and adds H / N to the averaged models."""

    state_attrs = ("h_sum",)

    def __init__(self, cfg: RunConfig, node_of_partition: Mapping[int, int]) -> None:
        super().__init__(cfg, node_of_partition)
        self.h_sum: Weights = []

    def server_step(
        self, server_round: int, w_t: Weights, update: Weights, replies: list[RecordDict]
    ) -> Weights:
        if not self.h_sum:
            self.h_sum = [np.zeros(w.shape, dtype=np.float64) for w in w_t]
        by_update = self.cfg.ri_aggregation == "update"
        for rd in replies:
            up = rd.array_records[rk.ARRAYS].to_numpy_ndarrays()
            for acc, u, w in zip(self.h_sum, up, w_t, strict=True):
                acc += u if by_update else u.astype(np.float64) - w
        n = self.cfg.num_clients
        return [(w.astype(np.float64) + d + h / n).astype(np.float32)
                for w, d, h in zip(w_t, update, self.h_sum, strict=True)]


class FedDynClient(ClientRule):
    """FedDyn's client half: the prox and dual gradient terms and the h_i update."""

    state_keys = (H_LOCAL,)

    def begin(
        self,
        start: Weights,
        down: Mapping[str, Weights],
        state: Mapping[str, Weights],
        lr: float,
        device: torch.device,
    ) -> GradientHook | None:
        alpha = self.cfg.feddyn_alpha
        s = [torch.from_numpy(a).to(device) for a in start]
        ah = [torch.from_numpy(alpha * h).to(device) for h in state[H_LOCAL]]

        def hook(params: list[torch.Tensor]) -> None:
            for p, si, hi in zip(params, s, ah, strict=True):
                g = p.grad
                assert g is not None
                g.add_(p.detach() - si, alpha=alpha).add_(hi)

        return hook

    def finish(
        self,
        start: Weights,
        final: Weights,
        num_steps: int,
        lr: float,
        state: dict[str, Weights],
    ) -> dict[str, Weights]:
        state[H_LOCAL] = [(h.astype(np.float64) + f - s).astype(np.float32)
                          for h, f, s in zip(state[H_LOCAL], final, start, strict=True)]
        return {}
