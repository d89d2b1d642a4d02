"""The names the run config accepts and the model/image-size rule, free of torch and numpy.

The config check imports only this module, ``task.data_paths`` and the standard library, so
a bad value fails in milliseconds. ``task.models``, ``task.partition`` and the strategies use
these same tables.
"""

from __future__ import annotations

MODEL_NAMES: tuple[str, ...] = ("cnn", "resnet18-gn", "vgg11")
PARTITION_NAMES: tuple[str, ...] = ("dirichlet", "dirichlet-equal", "iid")
REGIME_KINDS: tuple[str, ...] = ("rotate", "permute-labels")
TRACKINGS: tuple[str, ...] = ("tensorboard", "off")
"""``tracking``: TensorBoard event files under the run directory (server_app/tracking.py)."""
MAX_ROTATIONS = 4
"""Distinct rotations by multiples of 90 degrees: ``rotate`` allows at most this many regimes."""


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
