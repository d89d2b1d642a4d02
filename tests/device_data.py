"""Device data for tests: image folders and .npz files written from Fashion-MNIST or noise."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

FMNIST_CLASSES = ("tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt",
                  "sneaker", "bag", "boot")
"""Fashion-MNIST's ten classes as folder names (label i = the i-th)."""


def write_image_folder(root: Path, x: np.ndarray, y: np.ndarray, names: Sequence[str],
                       suffix: str = ".png") -> Path:
    """``root/<names[label]>/<index>.<suffix>`` for every image (uint8 NHWC, C = 1 or 3)."""
    from PIL import Image

    for i, (image, label) in enumerate(zip(x, y, strict=True)):
        folder = root / names[int(label)]
        folder.mkdir(parents=True, exist_ok=True)
        pixels = image[..., 0] if image.shape[-1] == 1 else image
        Image.fromarray(pixels).save(folder / f"{i:05d}{suffix}")
    return root


def skewed_fmnist_folders(root: Path, train_x: np.ndarray, train_y: np.ndarray,
                          num_nodes: int, per_node: int, seed: int) -> list[Path]:
    """One image folder per node, each with a skewed class mix (Dirichlet(0.5) over the ten
    classes), drawn without overlap from the training set."""
    rng = np.random.default_rng(seed)
    by_class = [list(rng.permutation(np.flatnonzero(train_y == c))) for c in range(10)]
    folders = []
    for node in range(num_nodes):
        mix = rng.dirichlet(np.full(10, 0.5))
        counts = rng.multinomial(per_node, mix)
        picked = [by_class[c].pop() for c in range(10) for _ in range(counts[c])]
        idx = np.asarray(picked, dtype=np.int64)
        folders.append(write_image_folder(root / f"node{node}", train_x[idx], train_y[idx],
                                          FMNIST_CLASSES))
    return folders
