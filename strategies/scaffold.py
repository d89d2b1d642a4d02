"""SCAFFOLD (Karimireddy et al. 2020), option II, composable with RI.

Client: each local step uses grad + c - c_i (added before clipping); afterwards
c_i+ = c_i - c + (s_i - y_K) / (K * eta_t), with s_i the client's (RI) start point, and it
uploads Delta_c_i = c_i+ - c_i next to its model. Server: w_{t+1} = w_t + eta_g * D and
c <- c + (1/N) * sum_i Delta_c_i over ALL N clients (not the m sampled: the known trap).
Control variates start at zero. Wire: twice FedAvg's bytes in each direction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict

from strategies.base import ClientRule, GradientHook, RIStrategy
from strategies.ri import Weights
from strategies.robust import vector_norm

if TYPE_CHECKING:
    from task.config import RunConfig

C_GLOBAL = "scaffold-c"
"""Down: the server's control variate c."""
DELTA_C = "scaffold-delta-c"
"""Up: the client's control-variate change Delta_c_i."""
C_LOCAL = "scaffold-c-i"
"""Client state: its control variate c_i."""


class ScaffoldServer(RIStrategy):
    """SCAFFOLD's server half: keeps c, sends it down, folds in the clients' Delta_c_i."""

    state_attrs = ("c",)

    up_keys = (DELTA_C,)

    def __init__(self, cfg: RunConfig, node_of_partition: Mapping[int, int]) -> None:
        super().__init__(cfg, node_of_partition)
        self.c: Weights = []

    def down_records(self, server_round: int) -> dict[str, ArrayRecord]:
        if not self.c:
            self.c = [np.zeros_like(w) for w in self._w_t]
        return {C_GLOBAL: ArrayRecord(self.c)}

    def fallback_limit(self, key: str, server_round: int) -> float:
        """Delta_c_i = -c + (s_i - y_K) / (K eta_t) with K >= 1 steps, so an honest one is at
        most ||c|| + ||model move|| / eta_t: the model's first-round bound carried over."""
        move = super().fallback_limit(key, server_round)
        if key != DELTA_C:
            return move
        return vector_norm(self.c) + move / self.cfg.lr_at(server_round)

    def server_step(
        self, server_round: int, w_t: Weights, update: Weights, replies: list[RecordDict]
    ) -> Weights:
        w_next = super().server_step(server_round, w_t, update, replies)
        total = [np.zeros(a.shape, dtype=np.float64) for a in self.c]
        for rd in replies:
            for acc, d in zip(total, rd.array_records[DELTA_C].to_numpy_ndarrays(), strict=True):
                acc += d
        n = self.cfg.num_clients
        self.c = [(c.astype(np.float64) + t / n).astype(np.float32)
                  for c, t in zip(self.c, total, strict=True)]
        return w_next


class ScaffoldClient(ClientRule):
    """SCAFFOLD's client half: the gradient correction c - c_i and the c_i update."""

    state_keys = (C_LOCAL,)
    down_keys = (C_GLOBAL,)

    def begin(
        self,
        start: Weights,
        down: Mapping[str, Weights],
        state: Mapping[str, Weights],
        lr: float,
        device: torch.device,
    ) -> GradientHook | None:
        self._c = down[C_GLOBAL]
        corr = [torch.from_numpy(c - ci).to(device)
                for c, ci in zip(self._c, state[C_LOCAL], strict=True)]

        def hook(params: list[torch.Tensor]) -> None:
            for p, k in zip(params, corr, strict=True):
                g = p.grad
                assert g is not None
                g.add_(k)

        return hook

    def finish(
        self,
        start: Weights,
        final: Weights,
        num_steps: int,
        lr: float,
        state: dict[str, Weights],
    ) -> dict[str, Weights]:
        scale = 1.0 / (num_steps * lr)
        c_i = state[C_LOCAL]
        new = [(ci.astype(np.float64) - c + scale * (s.astype(np.float64) - f))
               .astype(np.float32)
               for ci, c, s, f in zip(c_i, self._c, start, final, strict=True)]
        delta = [(n.astype(np.float64) - ci).astype(np.float32)
                 for n, ci in zip(new, c_i, strict=True)]
        state[C_LOCAL] = new
        return {DELTA_C: delta}
