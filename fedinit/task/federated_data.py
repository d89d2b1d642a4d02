"""Which examples each client holds: the one place that turns a RunConfig into client data.

Server (test set), clients (their partition) and the benchmarks (the plain-PyTorch floor)
all call these, so every path sees exactly the same data for the same seed. With device data
(``dataset=device``) a client's examples are the ones its node holds (node config
``data-dir``), split into train and local test the same way: a function of (run config, the
node's data-dir, client id).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedinit.config.data import device_schema, schema_of
from fedinit.data_sets.device import DeviceDataError, load_device_data
from fedinit.task.datasets import DataSplits, load_dataset
from fedinit.task.local_split import local_test_count, split_positions
from fedinit.task.noise import class_brightness_shift, client_channel_scale
from fedinit.task.partition import split
from fedinit.task.regimes import apply_regime, client_regimes

if TYPE_CHECKING:
    from fedinit.config import RunConfig


def dataset_of(cfg: RunConfig) -> DataSplits:
    """The run's data set (cached in-process by the loader)."""
    return load_dataset(cfg.data.dataset, cfg.data.resolved_data_dir)


@functools.lru_cache(maxsize=8)
def _train_subset(dataset: str, data_dir: str, limit: int, seed: int) -> np.ndarray:
    """Indices of the training examples in play (all, or a seeded random subset)."""
    n = len(load_dataset(dataset, data_dir).train_y)
    if limit <= 0 or limit >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng([seed, 7]).choice(n, size=limit, replace=False))


@functools.lru_cache(maxsize=8)
def _partitions(
    dataset: str, data_dir: str, limit: int, scheme: str, num_clients: int, alpha: float,
    seed: int,
) -> tuple[np.ndarray, ...]:
    subset = _train_subset(dataset, data_dir, limit, seed)
    labels = load_dataset(dataset, data_dir).train_y[subset]
    return tuple(subset[p] for p in split(labels, scheme, num_clients, alpha, seed))


def _all_partitions(cfg: RunConfig) -> tuple[np.ndarray, ...]:
    d = cfg.data
    return _partitions(d.dataset, d.resolved_data_dir, d.train_limit, d.partition,
                       cfg.num_clients, d.dirichlet_alpha, cfg.seed)


def partition_indices(cfg: RunConfig, partition_id: int) -> np.ndarray:
    """Training-set indices of one client's whole partition (train and local test split)."""
    return _all_partitions(cfg)[partition_id]


def _split(cfg: RunConfig, partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) positions within the partition (``local-test-fraction``)."""
    labels = dataset_of(cfg).train_y[partition_indices(cfg, partition_id)]
    return split_positions(labels, cfg.data.local_test_fraction, cfg.seed, partition_id)


def client_indices(cfg: RunConfig, partition_id: int) -> np.ndarray:
    """Training-set indices a client trains on: its partition less its local test split."""
    return partition_indices(cfg, partition_id)[_split(cfg, partition_id)[0]]


def local_test_indices(cfg: RunConfig, partition_id: int) -> np.ndarray:
    """Training-set indices of a client's local test split (empty at local-test-fraction 0)."""
    return partition_indices(cfg, partition_id)[_split(cfg, partition_id)[1]]


def partition_sizes(cfg: RunConfig) -> tuple[int, ...]:
    """Every client's training example count (what its replies must claim): its partition
    less its test split's count, which needs no draw (drawing every client's split took
    1.4 s at 10,000 clients, before round 1)."""
    return tuple(len(p) - local_test_count(len(p), cfg.data.local_test_fraction)
                 for p in _all_partitions(cfg))


NO_DATA_DIR = ("node config has no 'data-dir' (dataset=device: each node trains on data it "
               "holds); start the SuperNode with --node-config \"data-dir=/path/to/data ...\"")


def device_examples(cfg: RunConfig, data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """All of a device's examples (images uint8 NHWC, labels), checked against the run's
    schema; ValueError (one line naming the file) when they do not meet it."""
    if not data_dir:
        raise DeviceDataError(NO_DATA_DIR)
    return load_device_data(Path(data_dir).expanduser(), device_schema(cfg))


def _partition_examples(cfg: RunConfig, partition_id: int,
                        data_dir: str = "") -> tuple[np.ndarray, np.ndarray]:
    """The whole partition's (images uint8 NHWC, labels), with the paper's optional noise
    applied before the split, so an example looks the same in either split. With device
    data the partition is what the node holds."""
    if cfg.data.on_devices:
        x, y = device_examples(cfg, data_dir)
    else:
        data = dataset_of(cfg)
        idx = partition_indices(cfg, partition_id)
        x, y = data.train_x[idx], data.train_y[idx]
    if cfg.data.brightness_noise > 0:
        x = class_brightness_shift(x, y, cfg.data.brightness_noise, cfg.seed)
    if cfg.data.channel_noise > 0:
        x = client_channel_scale(x, partition_id, cfg.data.channel_noise, cfg.seed)
    return x, y


@functools.lru_cache(maxsize=8)
def _regimes(num_clients: int, num_regimes: int, seed: int) -> tuple[int, ...]:
    return tuple(int(r) for r in client_regimes(num_clients, num_regimes, seed))


def regimes_of(cfg: RunConfig) -> tuple[int, ...]:
    """Every client's regime by partition id (``num-regimes`` > 0; fedinit/task/regimes.py)."""
    return _regimes(cfg.num_clients, cfg.data.num_regimes, cfg.seed)


def regime_of(cfg: RunConfig, partition_id: int) -> int:
    """One client's regime: what a deployed client derives from run config + partition id."""
    return regimes_of(cfg)[partition_id]


def _as_regime_sees(cfg: RunConfig, partition_id: int, x: np.ndarray,
                    y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A client's examples transformed by its regime (unchanged with regimes off). Applied
    after the train/test positions are drawn from the raw labels, to both splits alike."""
    if cfg.data.num_regimes == 0:
        return x, y
    return apply_regime(x, y, cfg.data.regime_kind, regime_of(cfg, partition_id),
                        schema_of(cfg).num_classes, cfg.seed)


def _positions(cfg: RunConfig, partition_id: int, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) positions: the benchmark split (cached indices) or the device's."""
    if cfg.data.on_devices:
        return split_positions(y, cfg.data.local_test_fraction, cfg.seed, partition_id)
    return _split(cfg, partition_id)


def client_examples(cfg: RunConfig, partition_id: int,
                    data_dir: str = "") -> tuple[np.ndarray, np.ndarray]:
    """One client's training examples (images uint8 NHWC, labels); ``data_dir`` is the
    node's own data (device data only)."""
    x, y = _partition_examples(cfg, partition_id, data_dir)
    train = _positions(cfg, partition_id, y)[0]
    return _as_regime_sees(cfg, partition_id, x[train], y[train])


def client_test_examples(cfg: RunConfig, partition_id: int,
                         data_dir: str = "") -> tuple[np.ndarray, np.ndarray]:
    """One client's local test examples (personalized and federated evaluation); empty when
    there are none."""
    x, y = _partition_examples(cfg, partition_id, data_dir)
    test = _positions(cfg, partition_id, y)[1]
    return _as_regime_sees(cfg, partition_id, x[test], y[test])
