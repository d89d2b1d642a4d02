"""FedSAM (Qu et al. 2022): clients train with SAM, radius rho = ``sam-rho``.

Each local step ascends to w + rho * g / ||g||, takes the gradient there, returns to w and
steps with it (``sam_gradient``, handed to the run's SGD pass as its batch gradient);
clipping follows as for every method. The server half is FedAvg's; the wire cost is FedAvg's;
a step costs two forward/backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedinit.methods.fedavg import FedAvgServer
from fedinit.methods.method import (
    ClientRule,
    GradientFn,
    LocalJob,
    LocalOutcome,
    LossFn,
    MethodSpec,
    Params,
    check_range,
)

if TYPE_CHECKING:
    import torch
    from torch import nn

SAM_EPS = 1e-12
"""Guards the SAM ascent direction g / ||g|| against a zero gradient."""


@dataclass(frozen=True)
class FedSamParams(Params):
    sam_rho: float
    """rho: the SAM ascent radius; 0 is plain SGD."""

    def check(self) -> None:
        check_range("sam-rho", self.sam_rho, self.sam_rho >= 0, "a number >= 0 (0 disables it)")


class FedSamClient(ClientRule[FedSamParams]):
    """FedSAM's client half: one local pass whose batch gradient is SAM's."""

    def train(self, job: LocalJob) -> LocalOutcome:
        rho = self.params.sam_rho
        trained = job.sgd(job.start, gradient=sam_gradient(rho) if rho > 0 else None)
        return LocalOutcome(trained, dict(job.state), {})


def sam_gradient(rho: float) -> GradientFn:
    """The batch gradient of SAM with radius ``rho``: the gradient at w + rho * g / ||g||.

    The weights are restored bit for bit (copied back, not subtracted), so the SGD step that
    follows starts from the original point, as in the authors' ESAM optimizer. The loss
    reported is the one at the unperturbed point.
    """

    def gradient(model: nn.Module, params: list[torch.Tensor], xb: torch.Tensor,
                 yb: torch.Tensor, loss_fn: LossFn) -> torch.Tensor:
        import torch

        loss = loss_fn(model(xb), yb)
        loss.backward()
        pairs = [(p, p.grad) for p in params if p.grad is not None]
        if not pairs:
            return loss
        with torch.no_grad():
            norm = torch.linalg.vector_norm(torch.stack([g.norm() for _, g in pairs]))
            scale = rho / (float(norm) + SAM_EPS)
            saved = [p.detach().clone() for p, _ in pairs]
            for p, g in pairs:
                p.add_(g, alpha=scale)
        for _, g in pairs:
            g.zero_()
        loss_fn(model(xb), yb).backward()
        with torch.no_grad():
            for (p, _), w in zip(pairs, saved, strict=True):
                p.copy_(w)
        return loss

    return gradient


SPEC = MethodSpec(name="fedsam", label="FedSAM", params=FedSamParams, server=FedAvgServer,
                  client=FedSamClient, ri_aggregation="model",
                  async_refusal=None, secagg_refusal=None)
