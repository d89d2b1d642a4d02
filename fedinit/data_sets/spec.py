"""What every data set module provides: a ``DataSetSpec``, and what its loader returns.

A data set is one module in this package that defines ``SPEC``; ``fedinit.data_sets`` collects
them into the registry. The spec says where the data set is found (default locations and a
cheap presence check that reads no file), how it loads (a function of the path), and its
schema (classes, channels, image side, normalisation), which is what a model is built from.
Standard library and numpy only at import time, so the config check stays fast.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class DataNotFoundError(FileNotFoundError):
    """The dataset is not at the given path; the message says how to get it."""


class DataFormatError(ValueError):
    """A dataset file exists but is truncated, corrupted or laid out unexpectedly."""


@dataclass(frozen=True)
class Schema:
    """What every copy of a data set agrees on, and all a model needs to know of it."""

    num_classes: int
    in_channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...] = ()
    """Label i's name, where the data set names its classes (device data's folders)."""


@dataclass(frozen=True)
class DataSplits:
    """A dataset's train and test arrays (uint8 NHWC images, int64 labels) and its statistics."""

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    in_channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def image_size(self) -> int:
        """Side of the (square) images: the H of NHWC."""
        return int(self.train_x.shape[1])


@dataclass(frozen=True)
class DataSetSpec:
    """One data set: its name, schema, where it is found and how it loads.

    ``schema`` is None for a data set whose schema the run config declares (device data);
    ``load`` is None for one the server never holds (each node loads its own copy).
    """

    name: str
    schema: Schema | None
    candidates: tuple[Path, ...]
    """Where ``data-dir=""`` looks, in order: the first that holds it wins."""
    check_present: Callable[[Path], None]
    """Raise DataNotFoundError (saying how to get it) unless the data set is at the path."""
    load: Callable[[Path], DataSplits] | None

    @property
    def on_devices(self) -> bool:
        """Whether each node brings its own data (no central copy, no partitions)."""
        return self.load is None
