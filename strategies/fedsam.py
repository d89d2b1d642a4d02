"""FedSAM (Qu et al. 2022): clients train with SAM, radius rho = ``sam-rho``.

Each local step ascends to w + rho * g / ||g||, takes the gradient there, returns to w and
steps with it (``client_app.trainer.sam_gradient``); clipping follows as for every method.
The server half is FedAvg's; the wire cost is FedAvg's; a step costs two forward/backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.method import (
    ClientRule,
    MethodSpec,
    Params,
    ServerRule,
    ServerState,
    check_range,
)


@dataclass(frozen=True)
class FedSamParams(Params):
    sam_rho: float
    """rho: the SAM ascent radius; 0 is plain SGD."""

    def check(self) -> None:
        check_range("sam-rho", self.sam_rho, self.sam_rho >= 0, "a number >= 0 (0 disables it)")


class FedSamServer(ServerRule[FedSamParams, ServerState]):
    """FedSAM's server half: FedAvg's (the method lives on the client)."""


class FedSamClient(ClientRule[FedSamParams]):
    """FedSAM's client half: switches the local optimizer to SAM."""

    @property
    def sam_rho(self) -> float:
        return self.params.sam_rho


SPEC = MethodSpec(name="fedsam", label="FedSAM", params=FedSamParams, server=FedSamServer,
                  client=FedSamClient, ri_aggregation="model")
