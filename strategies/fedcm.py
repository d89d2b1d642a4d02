"""FedCM (Xu et al. 2021): local steps along alpha * grad + (1 - alpha) * d (``fedcm-alpha``).

Server: d = -D_prev / (K * eta_prev), the previous round's aggregate update D (RI variant)
scaled to a per-step gradient, sent down as an extra ArrayRecord (zeros in round 1, and kept
when a round has no usable reply); w_{t+1} = w_t + eta_g * D. K is learned from the replies:
their ``num-steps`` averaged with the SAME weights as D (examples by default), so that D / K
is a per-step direction also when client sizes differ. (An unweighted mean K under-counts the
large clients that dominate an example-weighted D; with the unequal Dirichlet-0.1 split that
over-scaled d by about 1.7x, and d fed back into the next D at a gain above 1: FedCM fell to
chance.) eta_prev is the local lr of the round that produced D.
Down: twice FedAvg's bytes; up: FedAvg's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, RecordDict

from client_app.trainer import num_steps
from strategies import records as rk
from strategies.base import ClientRule, GradientHook, RIStrategy
from strategies.ri import Weights

if TYPE_CHECKING:
    from task.config import RunConfig

MOMENTUM = "fedcm-d"
"""Down: the global momentum d (a gradient-like direction)."""


class FedCmServer(RIStrategy):
    """FedCM's server half: turns each round's D into the next round's momentum d."""

    state_attrs = ("d",)

    def __init__(self, cfg: RunConfig, node_of_partition: Mapping[int, int]) -> None:
        super().__init__(cfg, node_of_partition)
        self.d: Weights = []

    def down_records(self, server_round: int) -> dict[str, ArrayRecord]:
        if not self.d:
            self.d = [np.zeros_like(w) for w in self._w_t]
        return {MOMENTUM: ArrayRecord(self.d)}

    def server_step(
        self, server_round: int, w_t: Weights, update: Weights, replies: list[RecordDict]
    ) -> Weights:
        steps = [rd.metric_records[rk.METRICS][rk.NUM_STEPS] for rd in replies]
        # reply_problem guarantees positive int steps; weights as in D's mean
        k = float(np.average(np.asarray(steps, dtype=np.float64),
                             weights=self.reply_weights(replies)))
        scale = -1.0 / (k * self.cfg.lr_at(server_round))
        self.d = [(scale * u.astype(np.float64)).astype(np.float32) for u in update]
        return super().server_step(server_round, w_t, update, replies)

    def reply_problem(self, msg: Message) -> str | None:
        problem = super().reply_problem(msg)
        if problem is not None:
            return problem
        steps = msg.content.metric_records[rk.METRICS].get(rk.NUM_STEPS)
        if not isinstance(steps, int) or steps <= 0:
            return f"{rk.NUM_STEPS}={steps!r} is not a positive integer"
        # K scales d = -D / (K eta): a client under-reporting its steps inflates the momentum
        pid = self._sent_to[msg.metadata.src_node_id]
        n = self.true_examples(pid)
        c = self.cfg
        want = None if n is None else num_steps(n, c.local_epochs, c.batch_size)
        if want is not None and steps != want:
            return f"{rk.NUM_STEPS}={steps}, but partition {pid} takes {want} steps"
        return None


class FedCmClient(ClientRule):
    """FedCM's client half: mixes the local gradient with the server's momentum."""

    down_keys = (MOMENTUM,)

    def begin(
        self,
        start: Weights,
        down: Mapping[str, Weights],
        state: Mapping[str, Weights],
        lr: float,
        device: torch.device,
    ) -> GradientHook | None:
        alpha = self.cfg.fedcm_alpha
        md = [torch.from_numpy((1.0 - alpha) * d).to(device) for d in down[MOMENTUM]]

        def hook(params: list[torch.Tensor]) -> None:
            for p, k in zip(params, md, strict=True):
                g = p.grad
                assert g is not None
                g.mul_(alpha).add_(k)

        return hook
