"""Ditto (Li et al. 2021): a personal model v_i per client next to the usual global update.

Client: the global pass is FedAvg's local SGD (from the RI start point when beta != 0); then a
second pass of ``local-epochs`` trains v_i on the client's data with the gradient of
f_i(v) + (lambda/2) ||v - w_t||^2, lambda = ``ditto-lambda`` and w_t the global model the
server sent (Algorithm 1: v <- v - eta (grad f_i(v) + lambda (v - w_t))). v_i starts from the
first global model the client receives and is kept in its state; it never leaves the client.
Server: FedAvg's. Wire: FedAvg's. lambda = 0 is local training only; lambda -> infinity pins
v_i to w_t. Explicit steps need eta * lambda < 2 to be stable (the paper's form).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedinit.methods.fedavg import FedAvgServer
from fedinit.methods.method import (
    ClientRule,
    GradientHook,
    LocalJob,
    LocalOutcome,
    MethodSpec,
    Params,
    check_pull,
    check_range,
    proximal_hook,
)
from fedinit.methods.weights import Weights

if TYPE_CHECKING:
    import torch

PERSONAL = "ditto-v"
"""Client state: the personal model v_i."""
PERSONAL_STREAM = 1
"""The shuffling stream of the personal pass (``SgdPass``; the global pass is 0)."""


@dataclass(frozen=True)
class DittoParams(Params):
    ditto_lambda: float
    """lambda: how strongly v_i is pulled toward the global model; 0 = purely local."""

    def check(self) -> None:
        check_range("ditto-lambda", self.ditto_lambda, self.ditto_lambda >= 0,
                    "a number >= 0 (0 = local training only)")

    def check_with_lr(self, lr: float) -> None:
        check_pull("ditto-lambda", self.ditto_lambda, lr)


class DittoClient(ClientRule[DittoParams]):
    """Ditto's client half: FedAvg's global pass, then the personal pass on v_i."""

    state_keys = (PERSONAL,)
    personal_key = PERSONAL

    def initial_state(self, key: str, w_t: Weights) -> Weights:
        """v_i starts from the first global model the client receives."""
        return [a.copy() for a in w_t] if key == PERSONAL else super().initial_state(key, w_t)

    def train(self, job: LocalJob) -> LocalOutcome:
        outcome = super().train(job)  # the global pass: its final model is uploaded
        personal = job.sgd(job.state[PERSONAL], self.pull(job.w_t, job.device),
                           stream=PERSONAL_STREAM)
        return LocalOutcome(outcome.trained, {**outcome.state, PERSONAL: personal.final},
                            outcome.extras)

    def pull(self, w_t: Weights, device: torch.device) -> GradientHook | None:
        """The personal pass's gradient correction lambda (v - w_t); none at lambda = 0."""
        return proximal_hook(w_t, self.params.ditto_lambda, device)


SPEC = MethodSpec(name="ditto", label="Ditto", params=DittoParams, server=FedAvgServer,
                  client=DittoClient, ri_aggregation="model",
                  async_refusal=None, secagg_refusal=None)
