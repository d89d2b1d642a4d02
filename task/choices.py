"""The names the run config accepts and the model/image-size rule, free of torch and numpy.

The config check imports only this module, ``task.data_paths`` and the standard library, so
a bad value fails in milliseconds. ``task.models``, ``task.partition`` and the strategies use
these same tables.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

MODEL_NAMES: tuple[str, ...] = ("cnn", "resnet18-gn", "vgg11")
PARTITION_NAMES: tuple[str, ...] = ("dirichlet", "dirichlet-equal", "iid")


def check_model_input(name: str, image_size: int) -> None:
    """Raise ValueError when model ``name`` cannot take square images of side ``image_size``."""
    if name == "cnn" and (image_size < 4 or image_size % 4):
        raise ValueError(f"model 'cnn' needs an image side that is a multiple of 4, "
                         f"got {image_size}")
    if name == "vgg11" and image_size != 32:
        raise ValueError(f"model 'vgg11' needs 32x32 images (cifar10, cifar100), "
                         f"got {image_size}x{image_size}")
    if name == "resnet18-gn" and image_size < 28:
        raise ValueError(f"model 'resnet18-gn' needs images of side >= 28, got {image_size}")


def _method_names() -> ModuleType:
    """``strategies/names.py`` (the method tables' one source) loaded by file: importing it as
    ``strategies.names`` would first run ``strategies/__init__``, which imports torch and
    Flower. The module holds only constants, so a second copy of it is harmless."""
    path = Path(__file__).resolve().parents[1] / "strategies" / "names.py"
    spec = importlib.util.spec_from_file_location("_fedinit_method_names", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


METHODS_TABLES = _method_names()
