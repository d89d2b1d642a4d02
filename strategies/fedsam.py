"""FedSAM (Qu et al. 2022): clients train with SAM, radius rho = ``sam-rho``.

Each local step ascends to w + rho * g / ||g||, takes the gradient there, returns to w and
steps with it (``client_app.trainer.sam_gradient``); clipping follows as for every method.
The server half is FedAvg's; the wire cost is FedAvg's; a step costs two forward/backward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from strategies.base import ClientRule, RIStrategy

if TYPE_CHECKING:
    from task.config import RunConfig


class FedSamServer(RIStrategy):
    """FedSAM's server half: FedAvg's aggregation (the method lives on the client)."""


class FedSamClient(ClientRule):
    """FedSAM's client half: switches the local optimizer to SAM."""

    def __init__(self, cfg: RunConfig) -> None:
        super().__init__(cfg)
        self.sam_rho = cfg.sam_rho
