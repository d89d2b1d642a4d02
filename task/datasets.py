"""Dataset loading: Fashion-MNIST (IDX), CIFAR-10 (JPEG tarball or pickles), CIFAR-100 (pickles).

Everything comes back as uint8 NHWC arrays plus int64 labels, so partitioning and noise work on
raw pixels and normalisation happens once, in `to_tensor`. Loaded splits are cached in-process and
their arrays are made read-only so one caller cannot corrupt another's copy.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import os
import pickle
import re
import tarfile
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from store.files import atomic_write
from task.data_paths import (
    CIFAR10_HINT,
    CIFAR10_JPEG_TARBALL,
    CIFAR100_HINT,
    DATASET_NAMES,
    FASHION_FILES,
    FASHION_HINT,
    DataNotFoundError,
    fashion_folders,
    find_idx_file,
    find_jpeg_root,
    find_pickle_dir,
)

FASHION_MNIST_MEAN: tuple[float, ...] = (0.2860,)
FASHION_MNIST_STD: tuple[float, ...] = (0.3530,)
# Per-pixel statistics of the original CIFAR training sets (the JPEG copy's std is a bit lower).
CIFAR10_MEAN: tuple[float, ...] = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: tuple[float, ...] = (0.2470, 0.2435, 0.2616)
CIFAR100_MEAN: tuple[float, ...] = (0.5071, 0.4865, 0.4409)
CIFAR100_STD: tuple[float, ...] = (0.2673, 0.2564, 0.2762)

CACHE_ENV = "FEDINIT_CACHE_DIR"
_CACHE_VERSION = 1

_JPEG_MEMBER = re.compile(r"(?:^|/)(train|test)/([^/]+)/([^/]+\.jpe?g)$", re.IGNORECASE)


class DataFormatError(ValueError):
    """A dataset file exists but is truncated, corrupted or laid out unexpectedly."""


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


def load_dataset(name: str, data_dir: str) -> DataSplits:
    """Load a dataset by name; repeated calls with the same resolved path reuse one copy."""
    if name not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(DATASET_NAMES)}")
    resolved = str(Path(data_dir).expanduser().resolve())
    return _load_cached(name, resolved)


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, resolved: str) -> DataSplits:
    """Dispatch to the reader; cached on (name, resolved path)."""
    path = Path(resolved)
    if name == "fashion-mnist":
        splits = _load_fashion_mnist(path)
    elif name == "cifar10":
        splits = _load_cifar10(path)
    else:
        splits = _load_cifar100(path)
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


# ---------------------------------------------------------------- Fashion-MNIST (IDX files)


def _load_fashion_mnist(path: Path) -> DataSplits:
    """Read the four IDX files, gzipped or not, from `path` (or torchvision's FashionMNIST/raw)."""
    if not path.is_dir():
        raise DataNotFoundError(f"fashion-mnist not found: no directory {path}; {FASHION_HINT}")
    folders = fashion_folders(path)
    arrays: dict[str, np.ndarray] = {}
    for key, stem in FASHION_FILES.items():
        file = find_idx_file(folders, stem)
        if file is None:
            raise DataNotFoundError(
                f"fashion-mnist not found: {path / (stem + '.gz')} is missing; {FASHION_HINT}"
            )
        arrays[key] = _read_idx(file, expected_ndim=3 if key.endswith("_x") else 1)
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_x"], arrays[f"{split}_y"]
        if len(images) != len(labels):
            raise DataFormatError(
                f"fashion-mnist {split} split in {path}: {len(images)} images but "
                f"{len(labels)} labels"
            )
        if labels.size and int(labels.max()) >= 10:
            raise DataFormatError(
                f"fashion-mnist {split} labels in {path}: label {int(labels.max())} outside 0..9"
            )
    return DataSplits(
        train_x=arrays["train_x"][..., None],
        train_y=arrays["train_y"].astype(np.int64),
        test_x=arrays["test_x"][..., None],
        test_y=arrays["test_y"].astype(np.int64),
        num_classes=10,
        in_channels=1,
        mean=FASHION_MNIST_MEAN,
        std=FASHION_MNIST_STD,
    )


def _read_idx(file: Path, expected_ndim: int) -> np.ndarray:
    """Parse an IDX file of unsigned bytes: magic 00 00 08 ndim, big-endian uint32 dims, data."""
    try:
        if file.suffix == ".gz":
            with gzip.open(file, "rb") as handle:
                raw = handle.read()
        else:
            raw = file.read_bytes()
    except (OSError, EOFError, zlib.error) as error:
        raise DataFormatError(f"{file}: cannot decompress ({error})") from error
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataFormatError(f"{file}: not an unsigned-byte IDX file (bad magic {raw[:4]!r})")
    ndim = raw[3]
    if ndim != expected_ndim:
        raise DataFormatError(f"{file}: IDX has {ndim} dimensions, expected {expected_ndim}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataFormatError(f"{file}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = int(np.prod(dims))
    if len(raw) - header != expected:
        raise DataFormatError(
            f"{file}: IDX dims {dims} need {expected} data bytes, found {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


# ---------------------------------------------------------------- CIFAR-10 / CIFAR-100


def _load_cifar10(path: Path) -> DataSplits:
    """Find CIFAR-10 at `path`: the JPEG tarball, a folder with it or its extraction, or pickles."""
    if not path.exists():
        raise DataNotFoundError(f"cifar10 not found: no file or directory {path}; {CIFAR10_HINT}")
    if path.is_file():
        arrays = _cached_jpeg_decode(path)
    else:
        pickle_dir = find_pickle_dir(path, "cifar-10-batches-py", "data_batch_1")
        jpeg_root = find_jpeg_root(path)
        if pickle_dir is not None:
            arrays = _read_cifar10_pickles(pickle_dir)
        elif (path / CIFAR10_JPEG_TARBALL).is_file():
            arrays = _cached_jpeg_decode(path / CIFAR10_JPEG_TARBALL)
        elif jpeg_root is not None:
            arrays = _cached_jpeg_decode(jpeg_root)
        else:
            raise DataNotFoundError(
                f"cifar10 not found: {path} holds neither {CIFAR10_JPEG_TARBALL}, train/ and "
                f"test/ folders, nor cifar-10-batches-py; {CIFAR10_HINT}"
            )
    train_x, train_y, test_x, test_y = arrays
    return DataSplits(train_x, train_y, test_x, test_y, 10, 3, CIFAR10_MEAN, CIFAR10_STD)


def _load_cifar100(path: Path) -> DataSplits:
    """Read torchvision's cifar-100-python pickles (fine labels) from `path`."""
    if not path.exists():
        raise DataNotFoundError(
            f"cifar100 not found: no file or directory {path}; {CIFAR100_HINT}"
        )
    folder = find_pickle_dir(path, "cifar-100-python", "train") if path.is_dir() else None
    if folder is None:
        raise DataNotFoundError(
            f"cifar100 not found: {path} holds no cifar-100-python folder; {CIFAR100_HINT}"
        )
    train_x, train_y = _read_cifar_pickle(folder / "train", "fine_labels")
    test_x, test_y = _read_cifar_pickle(folder / "test", "fine_labels")
    _check_label_range([train_y, test_y], 100, folder)
    return DataSplits(train_x, train_y, test_x, test_y, 100, 3, CIFAR100_MEAN, CIFAR100_STD)


def _read_cifar10_pickles(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read data_batch_1..5 and test_batch from torchvision's cifar-10-batches-py."""
    parts = []
    for index in range(1, 6):
        file = folder / f"data_batch_{index}"
        if not file.is_file():
            raise DataNotFoundError(f"cifar10 not found: {file} is missing; {CIFAR10_HINT}")
        parts.append(_read_cifar_pickle(file, "labels"))
    test_file = folder / "test_batch"
    if not test_file.is_file():
        raise DataNotFoundError(f"cifar10 not found: {test_file} is missing; {CIFAR10_HINT}")
    test_x, test_y = _read_cifar_pickle(test_file, "labels")
    train_x = np.concatenate([x for x, _ in parts])
    train_y = np.concatenate([y for _, y in parts])
    _check_label_range([train_y, test_y], 10, folder)
    return train_x, train_y, test_x, test_y


def _read_cifar_pickle(file: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
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


def _check_label_range(label_arrays: list[np.ndarray], num_classes: int, where: Path) -> None:
    """Reject labels outside 0..num_classes-1, which would break one-hot losses later."""
    for labels in label_arrays:
        if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
            raise DataFormatError(
                f"{where}: labels span {int(labels.min())}..{int(labels.max())}, "
                f"expected 0..{num_classes - 1}"
            )


# ---------------------------------------------------------------- CIFAR-10 JPEG copy


def cache_dir() -> Path:
    """Where decoded datasets are cached: $FEDINIT_CACHE_DIR or ~/.cache/fedinit."""
    return Path(os.environ.get(CACHE_ENV, "~/.cache/fedinit")).expanduser()


def _source_fingerprint(source: Path) -> str:
    """A cache key from size and mtime (of the tarball, or summed over an extracted tree)."""
    if source.is_file():
        stat = source.stat()
        parts = [f"file|{stat.st_size}|{stat.st_mtime_ns}"]
    else:
        files = sorted(p for p in source.rglob("*") if p.is_file())
        size = sum(p.stat().st_size for p in files)
        mtime = max((p.stat().st_mtime_ns for p in files), default=0)
        parts = [f"dir|{source}|{len(files)}|{size}|{mtime}"]
    parts.append(f"v{_CACHE_VERSION}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _cached_jpeg_decode(source: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Decode the JPEG copy once and reuse a compressed .npz cache: decoding 60k JPEGs is slow."""
    cache_file = cache_dir() / f"cifar10-jpg-{_source_fingerprint(source)}.npz"
    if cache_file.is_file():
        try:
            with np.load(cache_file) as npz:
                return (npz["train_x"], npz["train_y"], npz["test_x"], npz["test_y"])
        except Exception as error:  # a bad cache is rebuilt, never fatal
            warnings.warn(f"ignoring unreadable cache {cache_file}: {error}", stacklevel=2)
    arrays = _decode_jpeg_tarball(source) if source.is_file() else _decode_jpeg_tree(source)
    _write_cache(cache_file, arrays)
    return arrays


def _write_cache(
    cache_file: Path, arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
) -> None:
    """Write the cache atomically, so concurrent runs never see half; failing only warns."""
    train_x, train_y, test_x, test_y = arrays
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache_file, lambda f: np.savez_compressed(
            f, train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y),
            mode=0o644)  # readable by all, whatever the umask: the cache may be shared
    except OSError as error:
        warnings.warn(f"could not write cache {cache_file}: {error}", stacklevel=3)


def _decode_image(data: bytes, where: str) -> np.ndarray:
    """Decode one 32x32 JPEG to an RGB uint8 array."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            pixels = np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError) as error:
        raise DataFormatError(f"{where}: cannot decode JPEG ({error})") from error
    if pixels.shape != (32, 32, 3):
        raise DataFormatError(f"{where}: image shape {pixels.shape}, expected (32, 32, 3)")
    return pixels


# key: (split, class name, file name) -> decoded pixels
_Decoded = dict[tuple[str, str, str], np.ndarray]


def _decode_jpeg_tarball(
    tarball: Path,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stream through the tarball once, decoding every train/ and test/ JPEG."""
    decoded: _Decoded = {}
    try:
        with tarfile.open(tarball, "r:*") as archive:
            for member in archive:
                match = _JPEG_MEMBER.search(member.name)
                if not member.isfile() or match is None:
                    continue
                handle = archive.extractfile(member)
                if handle is None:
                    continue
                where = f"{tarball}:{member.name}"
                decoded[(match[1].lower(), match[2], match[3])] = _decode_image(
                    handle.read(), where
                )
    except (tarfile.TarError, EOFError, zlib.error, OSError) as error:
        raise DataFormatError(f"{tarball}: truncated or corrupted tarball ({error})") from error
    return _assemble(decoded, tarball)


def _decode_jpeg_tree(root: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Decode an extracted copy laid out as train/<class>/*.jpg and test/<class>/*.jpg."""
    decoded: _Decoded = {}
    for split in ("train", "test"):
        for file in (root / split).glob("*/*"):
            if file.is_file() and file.suffix.lower() in (".jpg", ".jpeg"):
                decoded[(split, file.parent.name, file.name)] = _decode_image(
                    file.read_bytes(), str(file)
                )
    return _assemble(decoded, root)


def _assemble(
    decoded: _Decoded, source: Path
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Stack images in (class, file name) order; class folders sort into label order."""
    classes = sorted({cls for split, cls, _ in decoded if split == "train"})
    test_classes = sorted({cls for split, cls, _ in decoded if split == "test"})
    if len(classes) != 10 or classes != test_classes:
        raise DataFormatError(
            f"{source}: expected the same 10 class folders in train/ and test/, found "
            f"train {classes} and test {test_classes}"
        )
    label_of = {cls: index for index, cls in enumerate(classes)}
    result: list[np.ndarray] = []
    for split in ("train", "test"):
        keys = sorted(key for key in decoded if key[0] == split)
        result.append(np.stack([decoded[key] for key in keys]))
        result.append(np.array([label_of[key[1]] for key in keys], dtype=np.int64))
    train_x, train_y, test_x, test_y = result
    return train_x, train_y, test_x, test_y
