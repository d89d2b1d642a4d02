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
    check_pull,
    check_range,
    gradient_hook,
    zeros_like,
)
from fedinit.methods.weights import Weights

if TYPE_CHECKING:
    import torch

H_LOCAL = "feddyn-h-i"
"""Client state: h_i, the running sum of its own Delta_i."""


@dataclass(frozen=True)
class FedDynParams(Params):
    feddyn_alpha: float
    """alpha: the weight of the proximal and the dual term."""

    def check(self) -> None:
        check_range("feddyn-alpha", self.feddyn_alpha, self.feddyn_alpha > 0, "a number > 0")

    def check_with_lr(self, lr: float) -> None:
        check_pull("feddyn-alpha", self.feddyn_alpha, lr)


@dataclass(frozen=True)
class FedDynState(ServerState):
    h_sum: Weights
    """H = sum over all clients of h_j (float64), zeros before round 1."""


class FedDynServer(ServerRule[FedDynParams, FedDynState]):
    """FedDyn's server half: keeps H = sum_j h_j and adds H / N to the averaged models."""

    state_type = FedDynState
    robust_refusal = ("FedDyn's H must stay the sum over all clients of h_i, and each client "
                      "sums its own raw moves into h_i: a robust rule would break H = sum_j h_j")

    def init(self, w0: Weights) -> FedDynState:
        return FedDynState(h_sum=zeros_like(w0, np.float64))

    def update(self, state: FedDynState, w_t: Weights,
               rnd: RoundInput) -> tuple[Weights, FedDynState]:
        if rnd.upload_sums is not None:  # secure aggregation: only the moves' sum is known
            h_sum = [h.astype(np.float64) + d
                     for h, d in zip(state.h_sum, rnd.upload_sum(w_t), strict=True)]
        else:  # each move added to H in turn: the float64 sums of every earlier run
            h_sum = [h.astype(np.float64).copy() for h in state.h_sum]
            for move in rnd.moves(w_t):
                for acc, d in zip(h_sum, move, strict=True):
                    acc += d
        n = rnd.num_clients
        w_next = [(w.astype(np.float64) + d + h / n).astype(np.float32)
                  for w, d, h in zip(w_t, rnd.aggregate, h_sum, strict=True)]
        return w_next, FedDynState(h_sum=h_sum)


class FedDynClient(ClientRule[FedDynParams]):
    """FedDyn's client half: the prox and dual gradient terms and the h_i update."""

    state_keys = (H_LOCAL,)
    accounted_keys = (H_LOCAL,)

    def begin(self, start: Weights, down: Mapping[str, Weights], state: Mapping[str, Weights],
              lr: float, device: torch.device) -> GradientHook | None:
        alpha = self.params.feddyn_alpha
        return gradient_hook(device, anchor=start, pull=alpha,
                             shift=[alpha * h for h in state[H_LOCAL]])

    def finish(self, start: Weights, final: Weights, num_steps: int, lr: float,
               down: Mapping[str, Weights], state: Mapping[str, Weights],
               ) -> tuple[dict[str, Weights], dict[str, Weights]]:
        h = [(h.astype(np.float64) + f - s).astype(np.float32)
             for h, f, s in zip(state[H_LOCAL], final, start, strict=True)]
        return {**state, H_LOCAL: h}, {}


SPEC = MethodSpec(name="feddyn", label="FedDyn", params=FedDynParams, server=FedDynServer,
                  client=FedDynClient, ri_aggregation="update",
                  async_refusal=("its correction H / N, added at every flush, diverges once "
                                 "replies are a version stale (least squares, 4 of 8 clients a "
                                 "flush: rel. error 5 after 60 flushes, sync 4e-5; "
                                 "docs/algorithms.md, FedBuff)"),
                  secagg_refusal=None)
