"""Central evaluation of the global model on the data set's held-out test split.

The split is used as it is: the clients' optional channel and brightness noise
(``fedinit/task/noise.py``) is not applied, so runs with and without it are scored on the same
images.
"""

from __future__ import annotations

import numpy as np
import torch

from fedinit.config import RunConfig
from fedinit.task.datasets import to_tensor
from fedinit.task.device import device
from fedinit.task.evaluation import evaluate
from fedinit.task.federated_data import dataset_of
from fedinit.task.models import initial_model, set_weights


class CentralEvaluator:
    """Holds the test tensors and one model instance; ``__call__`` scores a weight list."""

    def __init__(self, cfg: RunConfig) -> None:
        data = dataset_of(cfg)
        dev = device()
        self.x = to_tensor(data.test_x, data.mean, data.std).to(dev)
        self.y = torch.from_numpy(data.test_y.copy()).long().to(dev)
        self.model = initial_model(cfg, data).to(dev)

    def __call__(self, weights: list[np.ndarray]) -> tuple[float, float]:
        """(test loss, test accuracy in [0, 1])."""
        set_weights(self.model, weights)
        return evaluate(self.model, self.x, self.y)
