"""The data-set registry: one module per data set, each defining ``SPEC`` (a DataSetSpec).

Adding a data set is one module in this package (its schema, where it is found, how it loads)
and one entry in ``HOMES``; the config check, the loaders and the model builder read
everything from the spec. ``device`` is the data set each node brings itself. A data set's
module loads on first use (``spec_of``), so a run on Fashion-MNIST does not load the CIFAR
readers (issue 43: each half loads what it needs).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from fedinit.data_sets.spec import (
    DataFormatError,
    DataNotFoundError,
    DataSetSpec,
    DataSplits,
    Schema,
)
from fedinit.lazy import SpecRegistry

__all__ = ["DATASET_NAMES", "DEVICE", "SPECS", "DataFormatError", "DataNotFoundError",
           "DataSetSpec", "DataSplits", "Schema", "default_data_dir", "spec_of"]

HOMES: dict[str, str] = {"fashion-mnist": "fashion_mnist", "cifar10": "cifar10",
                         "cifar100": "cifar100", "device": "device"}
"""Data-set name -> its module in this package (which holds its ``SPEC``), in the order
the docs and errors list them."""
DEVICE = "device"
"""The data set each node brings itself (``device.py``'s ``NAME``)."""


SPECS: Mapping[str, DataSetSpec] = SpecRegistry(__name__, HOMES, DataSetSpec)
"""The specs by name, each data set's module imported on first use; iterating the values
loads every data set."""
DATASET_NAMES: tuple[str, ...] = tuple(HOMES)


def spec_of(name: str) -> DataSetSpec:
    """The registry entry of data set ``name``; ValueError naming the allowed ones."""
    if name not in SPECS:
        raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(DATASET_NAMES)}")
    return SPECS[name]


def default_data_dir(name: str) -> Path:
    """The first default location of ``name`` that holds it, else its first candidate."""
    spec = spec_of(name)
    for path in spec.candidates:
        try:
            spec.check_present(path)
        except DataNotFoundError:
            continue
        return path
    return spec.candidates[0] if spec.candidates else Path()


def split_floats(text: str) -> tuple[float, ...]:
    """'0.5, 0.25' -> (0.5, 0.25); ValueError on anything that is not a number."""
    return tuple(float(part) for part in text.split(","))


def split_names(text: str) -> tuple[str, ...]:
    """'cat, dog' -> ('cat', 'dog'); empty entries are kept (the config check refuses them)."""
    return tuple(part.strip() for part in text.split(",")) if text.strip() else ()
