"""Dataset loading: the registry's loaders behind one cached entry point, and `to_tensor`.

Everything comes back as uint8 NHWC arrays plus int64 labels, so partitioning and noise work on
raw pixels and normalisation happens once, in `to_tensor`. Loaded splits are cached in-process and
their arrays are made read-only so one caller cannot corrupt another's copy. The readers live
with their data sets in ``fedinit/data_sets/``.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from fedinit.data_sets import DATASET_NAMES, cifar10, cifar100, fashion_mnist, spec_of
from fedinit.data_sets.cifar10 import CACHE_ENV, cache_dir
from fedinit.data_sets.spec import DataFormatError, DataNotFoundError, DataSplits

__all__ = ["CACHE_ENV", "CIFAR100_MEAN", "CIFAR100_STD", "CIFAR10_MEAN", "CIFAR10_STD",
           "DATASET_NAMES", "FASHION_MNIST_MEAN", "FASHION_MNIST_STD", "DataFormatError",
           "DataNotFoundError",
           "DataSplits", "cache_dir", "load_dataset", "to_tensor"]

FASHION_MNIST_MEAN: tuple[float, ...] = fashion_mnist.SCHEMA.mean
FASHION_MNIST_STD: tuple[float, ...] = fashion_mnist.SCHEMA.std
CIFAR10_MEAN: tuple[float, ...] = cifar10.SCHEMA.mean
CIFAR10_STD: tuple[float, ...] = cifar10.SCHEMA.std
CIFAR100_MEAN: tuple[float, ...] = cifar100.SCHEMA.mean
CIFAR100_STD: tuple[float, ...] = cifar100.SCHEMA.std


def load_dataset(name: str, data_dir: str) -> DataSplits:
    """Load a dataset by name; repeated calls with the same resolved path reuse one copy."""
    spec = spec_of(name)
    if spec.load is None:
        raise ValueError(f"dataset {name!r} has no central copy: each node loads its own "
                         "(fedinit.task.federated_data.client_examples)")
    resolved = str(Path(data_dir).expanduser().resolve())
    return _load_cached(name, resolved)


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, resolved: str) -> DataSplits:
    """Dispatch to the data set's reader; cached on (name, resolved path)."""
    load = spec_of(name).load
    assert load is not None
    splits = load(Path(resolved))
    for array in (splits.train_x, splits.train_y, splits.test_x, splits.test_y):
        array.flags.writeable = False
    return splits


def to_tensor(
    x: np.ndarray, mean: tuple[float, ...] | list[float], std: tuple[float, ...] | list[float]
) -> torch.Tensor:
    """Turn uint8 NHWC images into a normalised float32 NCHW tensor: (x/255 - mean) / std."""
    if x.ndim != 4:
        raise ValueError(f"expected images of shape (N, H, W, C), got shape {x.shape}")
    channels = x.shape[3]
    if len(mean) != channels or len(std) != channels:
        raise ValueError(
            f"mean/std have {len(mean)}/{len(std)} entries but the images have {channels} channels"
        )
    tensor = torch.from_numpy(x.astype(np.float32)).permute(0, 3, 1, 2).contiguous()
    tensor.div_(255.0)
    tensor.sub_(torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1))
    tensor.div_(torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1))
    return tensor
