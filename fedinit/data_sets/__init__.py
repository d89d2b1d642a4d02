"""The data-set registry: one module per data set, each defining ``SPEC`` (a DataSetSpec).

Adding a data set is one module in this package (its schema, where it is found, how it loads)
and one entry in ``_MODULES``; the config check, the loaders and the model builder read
everything from the spec. ``device`` is the data set each node brings itself.
"""

from __future__ import annotations

from pathlib import Path

from fedinit.data_sets import cifar10, cifar100, device, fashion_mnist
from fedinit.data_sets.spec import (
    DataFormatError,
    DataNotFoundError,
    DataSetSpec,
    DataSplits,
    Schema,
)

__all__ = ["DATASET_NAMES", "SPECS", "DataFormatError", "DataNotFoundError", "DataSetSpec",
           "DataSplits", "Schema", "default_data_dir", "spec_of"]

_MODULES = (fashion_mnist, cifar10, cifar100, device)
SPECS: dict[str, DataSetSpec] = {m.SPEC.name: m.SPEC for m in _MODULES}
DATASET_NAMES: tuple[str, ...] = tuple(SPECS)


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
