"""What the CIFAR data sets share: torchvision's pickle batches and the label check."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from fedinit.data_sets.spec import DataFormatError, DataNotFoundError


def find_pickle_dir(path: Path, folder_name: str, marker: str) -> Path | None:
    """Accept either torchvision's root (holding `folder_name`) or that folder itself."""
    for candidate in (path / folder_name, path):
        if (candidate / marker).is_file():
            return candidate
    return None


def read_cifar_pickle(file: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR pickle (dict with data (N, 3072) uint8 and a label list) as NHWC + int64.

    These are torchvision's official files; pickle can run code, so only load trusted copies.
    """
    if not file.is_file():
        raise DataNotFoundError(f"{file} is missing")
    try:
        with open(file, "rb") as handle:
            batch: Any = pickle.load(handle, encoding="bytes")
    except Exception as error:  # any unpickling failure means a bad file
        reason = f"{type(error).__name__}: {error}"
        raise DataFormatError(f"{file}: cannot unpickle ({reason})") from error
    if not isinstance(batch, dict):
        raise DataFormatError(f"{file}: expected a pickled dict, got {type(batch).__name__}")
    entries = {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in batch.items()}
    if "data" not in entries or label_key not in entries:
        raise DataFormatError(f"{file}: missing 'data' or {label_key!r} (keys {sorted(entries)})")
    data = np.asarray(entries["data"])
    labels = np.asarray(entries[label_key], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataFormatError(
            f"{file}: 'data' should be uint8 of shape (N, 3072), got {data.dtype} {data.shape}"
        )
    if labels.shape != (data.shape[0],):
        raise DataFormatError(f"{file}: {data.shape[0]} images but {labels.shape} labels")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def check_label_range(label_arrays: list[np.ndarray], num_classes: int, where: Path) -> None:
    """Reject labels outside 0..num_classes-1, which would break one-hot losses later."""
    for labels in label_arrays:
        if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
            raise DataFormatError(
                f"{where}: labels span {int(labels.min())}..{int(labels.max())}, "
                f"expected 0..{num_classes - 1}"
            )
