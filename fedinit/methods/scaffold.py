"""SCAFFOLD (Karimireddy et al. 2020), option II, composable with RI.

Client: each local step uses grad + c - c_i (added before clipping); afterwards
c_i+ = c_i - c + (s_i - y_K) / (K * eta_t), with s_i the client's (RI) start point, and it
uploads Delta_c_i = c_i+ - c_i next to its model. Server: w_{t+1} = w_t + eta_g * D and
c <- c + (1/N) * sum_i Delta_c_i over ALL N clients (not the m sampled: the known trap).
Under a robust ``aggregation`` the sum over the m aggregated replies is replaced by
m * rule(Delta_c_i) with the rule D was built by (``RoundInput.sum_of``): c <- c + (m/N) *
median(Delta_c_i) under ``median``; the replies Krum/Bulyan dropped are not in the m, nor
those whose Delta_c_i their selection screened (``robust.unaccounted``: moves kept).
Control variates start at zero. Wire: twice FedAvg's bytes in each direction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from fedinit.methods.method import (
    ClientRule,
    GradientHook,
    MethodSpec,
    Params,
    RoundInput,
    ServerRule,
    ServerState,
    apply_step,
    gradient_hook,
    zeros_like,
)
from fedinit.methods.norms import vector_norm
from fedinit.methods.weights import Weights

if TYPE_CHECKING:
    import torch

C_GLOBAL = "scaffold-c"
"""Down: the server's control variate c."""
DELTA_C = "scaffold-delta-c"
"""Up: the client's control-variate change Delta_c_i."""
C_LOCAL = "scaffold-c-i"
"""Client state: its control variate c_i."""


@dataclass(frozen=True)
class ScaffoldState(ServerState):
    c: Weights
    """The server control variate c (float32), zeros before round 1."""


class ScaffoldServer(ServerRule[Params, ScaffoldState]):
    """SCAFFOLD's server half: keeps c, sends it down, folds in the clients' Delta_c_i."""

    state_type = ScaffoldState
    up_keys = (DELTA_C,)

    def init(self, w0: Weights) -> ScaffoldState:
        return ScaffoldState(c=zeros_like(w0))

    def down(self, state: ScaffoldState) -> dict[str, Weights]:
        return {C_GLOBAL: state.c}

    def update(self, state: ScaffoldState, w_t: Weights,
               rnd: RoundInput) -> tuple[Weights, ScaffoldState]:
        total = rnd.extra_sum(DELTA_C)
        c = [(c.astype(np.float64) + t / rnd.num_clients).astype(np.float32)
             for c, t in zip(state.c, total, strict=True)]
        return apply_step(w_t, rnd.aggregate, rnd.server_lr), ScaffoldState(c=c)

    def extra_fallback_limit(self, key: str, state: ScaffoldState, move_limit: float,
                             lr: float) -> float:
        """Delta_c_i = -c + (s_i - y_K) / (K eta_t) with K >= 1 steps, so an honest one is at
        most ||c|| + ||model move|| / eta_t: the model's first-round bound carried over."""
        return vector_norm(state.c) + move_limit / lr


class ScaffoldClient(ClientRule[Params]):
    """SCAFFOLD's client half: the gradient correction c - c_i and the c_i update."""

    state_keys = (C_LOCAL,)
    accounted_keys = (C_LOCAL,)
    uploaded_changes = {DELTA_C: C_LOCAL}
    down_keys = (C_GLOBAL,)

    def begin(self, start: Weights, down: Mapping[str, Weights], state: Mapping[str, Weights],
              lr: float, device: torch.device) -> GradientHook | None:
        correction = [c - ci for c, ci in zip(down[C_GLOBAL], state[C_LOCAL], strict=True)]
        return gradient_hook(device, shift=correction)

    def finish(self, start: Weights, final: Weights, num_steps: int, lr: float,
               down: Mapping[str, Weights], state: Mapping[str, Weights],
               ) -> tuple[dict[str, Weights], dict[str, Weights]]:
        scale = 1.0 / (num_steps * lr)
        c_i = state[C_LOCAL]
        new = [(ci.astype(np.float64) - c + scale * (s.astype(np.float64) - f))
               .astype(np.float32)
               for ci, c, s, f in zip(c_i, down[C_GLOBAL], start, final, strict=True)]
        delta = [(n.astype(np.float64) - ci).astype(np.float32)
                 for n, ci in zip(new, c_i, strict=True)]
        return {**state, C_LOCAL: new}, {DELTA_C: delta}


SPEC = MethodSpec(name="scaffold", label="SCAFFOLD", params=Params, server=ScaffoldServer,
                  client=ScaffoldClient, ri_aggregation="model",
                  async_refusal=None, secagg_refusal=None)
