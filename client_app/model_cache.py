"""Process-level caches of what every message of a run needs again: data tensors and w_0.

In simulation one worker serves many clients for the whole run, so these save the repeated
decoding. In a deployment the warm executor (``fedinit/node/warm_executor.py``, the default of
``fedinit/node/launch.py``) keeps a worker process that serves the node's messages, so they fill
once there too; only with Flower's own executor (``--executor flower``, a new process per
message) does each message fill them anew.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from logging import INFO

import numpy as np
import torch
from flwr.common.logger import log
from torch import nn

from fedinit.config import RunConfig
from fedinit.config.data import schema_of
from fedinit.task import models
from fedinit.task.datasets import to_tensor
from fedinit.task.device import describe, device
from fedinit.task.federated_data import client_examples, client_test_examples


@functools.lru_cache(maxsize=4)
def cached_model(cfg: RunConfig) -> nn.Module:
    """The run's model at w_0 (seeded), on the device; callers overwrite its weights.

    Logs the device once per model and process, so a node's log says where it trains."""
    dev = device()
    log(INFO, "ClientApp trains %s on %s", cfg.train.model, describe(dev))
    return models.initial_model(cfg).to(dev)


@functools.lru_cache(maxsize=4)
def initial_weights(cfg: RunConfig) -> tuple[np.ndarray, ...]:
    """w_0: the same seeded initialisation the server starts from."""
    return tuple(models.initial_weights(cfg))


CACHE_BYTES = 1 << 30
"""Bound of each client-tensor cache per process. A run's clients together hold its
training set once (Dirichlet and iid partitions do not repeat examples): Fashion-MNIST's is
188 MB as float32, CIFAR-10's 614 MB; so a worker keeps every client it serves, where a
bound by count (256 clients) made a worker serving 500 clients a round decode each anew."""

Tensors = tuple[torch.Tensor, torch.Tensor]


class _TensorCache:
    """Least-recently-used (key -> tensors), bounded by the tensors' bytes, not by count."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.held: OrderedDict[tuple[object, ...], Tensors] = OrderedDict()
        self.bytes = 0

    def get(self, key: tuple[object, ...], make: Callable[[], Tensors]) -> Tensors:
        if key in self.held:
            self.held.move_to_end(key)
            return self.held[key]
        value = make()
        self.held[key] = value
        self.bytes += _nbytes(value)
        while self.bytes > self.max_bytes and len(self.held) > 1:
            _, old = self.held.popitem(last=False)
            self.bytes -= _nbytes(old)
        return value

    def cache_clear(self) -> None:
        self.held.clear()
        self.bytes = 0


def _nbytes(tensors: Tensors) -> int:
    return sum(t.element_size() * t.nelement() for t in tensors)


_train_cache = _TensorCache(CACHE_BYTES)
_test_cache = _TensorCache(CACHE_BYTES)


def client_tensors(cfg: RunConfig, partition_id: int, data_dir: str = "") -> Tensors:
    """One client's normalised training images and labels, on the device (``data_dir``: the
    node's own data, device data only)."""
    return _train_cache.get((cfg, partition_id, data_dir), lambda: _on_device(
        cfg, *client_examples(cfg, partition_id, data_dir)))


def client_test_tensors(cfg: RunConfig, partition_id: int, data_dir: str = "") -> Tensors:
    """One client's local test split (personalized and federated evaluation), normalised,
    on the device."""
    return _test_cache.get((cfg, partition_id, data_dir), lambda: _on_device(
        cfg, *client_test_examples(cfg, partition_id, data_dir)))


def _on_device(cfg: RunConfig, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    schema = schema_of(cfg)
    dev = device()
    return (to_tensor(x, schema.mean, schema.std).to(dev),
            torch.from_numpy(y.copy()).long().to(dev))
