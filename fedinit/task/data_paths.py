"""Where each data set lives and whether it is there, without reading it.

A facade over the registry (``fedinit.data_sets``) for the names other code imports. No torch:
the config check and ``fedinit-simulate`` refuse a missing data set in milliseconds, before
torch, Ray or any SuperNode starts; "present" here means "loadable" there (up to damage).
"""

from __future__ import annotations

from pathlib import Path

from fedinit.data_sets import DATASET_NAMES, SPECS, default_data_dir, spec_of
from fedinit.data_sets import cifar10 as _cifar10
from fedinit.data_sets import cifar100 as _cifar100
from fedinit.data_sets import fashion_mnist as _fashion
from fedinit.data_sets.cifar_files import find_pickle_dir
from fedinit.data_sets.spec import DataNotFoundError

__all__ = ["CIFAR100_HINT", "CIFAR10_HINT", "CIFAR10_JPEG_TARBALL", "DATASET_NAMES",
           "DEFAULT_DATA_CANDIDATES", "FASHION_FILES", "FASHION_HINT", "IMAGE_SIZES",
           "DataNotFoundError", "check_present", "default_data_dir", "fashion_folders",
           "find_idx_file", "find_jpeg_root", "find_pickle_dir"]

IMAGE_SIZES: dict[str, int] = {name: spec.schema.image_size for name, spec in SPECS.items()
                               if spec.schema is not None}
"""Side of each benchmark data set's square images (device data: ``device-image-size``)."""
DEFAULT_DATA_CANDIDATES: dict[str, tuple[Path, ...]] = {
    name: spec.candidates for name, spec in SPECS.items() if spec.candidates}

CIFAR10_JPEG_TARBALL = _cifar10.JPEG_TARBALL
FASHION_FILES = _fashion.FILES
FASHION_HINT = _fashion.HINT
CIFAR10_HINT = _cifar10.HINT
CIFAR100_HINT = _cifar100.HINT
fashion_folders = _fashion.folders
find_idx_file = _fashion.find_idx_file
find_jpeg_root = _cifar10.find_jpeg_root


def check_present(name: str, path: Path) -> None:
    """Raise DataNotFoundError (with how to get it) unless data set ``name`` is at ``path``."""
    spec_of(name).check_present(path)
