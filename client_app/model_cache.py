"""Process-level caches of what every message of a run needs again: data tensors and w_0.

In simulation one worker serves many clients for the whole run, so these save the repeated
decoding. In a deployment the warm executor (``node/warm_executor.py``, the default of
``node/launch.py``) keeps a worker process that serves the node's messages, so they fill
once there too; only with Flower's own executor (``--executor flower``, a new process per
message) does each message fill them anew.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from task import models
from task.config import RunConfig
from task.data_sets import schema_of
from task.datasets import to_tensor
from task.device import device
from task.federated_data import client_examples, client_test_examples


@functools.lru_cache(maxsize=4)
def cached_model(cfg: RunConfig) -> nn.Module:
    """The run's model at w_0 (seeded), on the device; callers overwrite its weights."""
    return models.initial_model(cfg).to(device())


@functools.lru_cache(maxsize=4)
def initial_weights(cfg: RunConfig) -> tuple[np.ndarray, ...]:
    """w_0: the same seeded initialisation the server starts from."""
    return tuple(models.initial_weights(cfg))


@functools.lru_cache(maxsize=256)
def client_tensors(cfg: RunConfig, partition_id: int,
                   data_dir: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """One client's normalised training images and labels, on the device (``data_dir``: the
    node's own data, device data only)."""
    return _on_device(cfg, *client_examples(cfg, partition_id, data_dir))


@functools.lru_cache(maxsize=256)
def client_test_tensors(cfg: RunConfig, partition_id: int,
                        data_dir: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """One client's local test split (personalized and federated evaluation), normalised,
    on the device."""
    return _on_device(cfg, *client_test_examples(cfg, partition_id, data_dir))


def _on_device(cfg: RunConfig, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    schema = schema_of(cfg)
    dev = device()
    return (to_tensor(x, schema.mean, schema.std).to(dev),
            torch.from_numpy(y.copy()).long().to(dev))
