"""Device data: each node trains on data it holds itself, in its node config's ``data-dir``.

Two formats: an image folder (``<class>/<file>``, PNG or JPEG, class folders named among the
run's ``device-classes``) or an array file (``.npz`` with ``x`` uint8 NHWC or NHW and ``y``
int labels in 0..C-1). The run config declares the schema every device must meet (classes,
image side, channels, normalisation); a device whose data does not meet it fails with one line
naming the file and the problem (``DeviceDataError``). Images are never resized: a wrong size
is a mismatch, since silently rescaled data would train a different task.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from fedinit.data_sets.spec import DataFormatError, DataSetSpec, Schema

NAME = "device"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
MODES = {1: ("L",), 3: ("RGB",)}
"""Pillow modes accepted for each channel count (no silent conversion: an RGBA or palette
image is a mismatch, named with its mode)."""


class DeviceDataError(DataFormatError):
    """A device's data does not meet the run's schema, or cannot be read (one line)."""


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def check_present(path: Path) -> None:
    """The server holds no device data: nothing to look for."""
    del path


def load_device_data(path: Path, schema: Schema) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 NHWC, int64 labels) of one device's data; DeviceDataError when it does
    not meet ``schema``. Cached per (resolved path, schema, the path's mtime)."""
    if not path.exists():
        raise DeviceDataError(f"{path}: no such file or folder (node config data-dir)")
    resolved = path.resolve()
    x, y = _load_cached(str(resolved), schema, resolved.stat().st_mtime_ns)
    return x, y


@functools.lru_cache(maxsize=4)
def _load_cached(resolved: str, schema: Schema, _mtime: int) -> tuple[np.ndarray, np.ndarray]:
    path = Path(resolved)
    if path.is_dir():
        x, y = _read_image_folder(path, schema)
    elif path.suffix.lower() == ".npz":
        x, y = _read_npz(path, schema)
    else:
        raise DeviceDataError(f"{path}: neither an image folder nor an .npz file")
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y


def _read_image_folder(root: Path, schema: Schema) -> tuple[np.ndarray, np.ndarray]:
    """Decode every ``<class>/<file>`` under ``root``, in (class folder, file name) order."""
    label_of = {name: i for i, name in enumerate(schema.class_names)}
    images: list[np.ndarray] = []
    labels: list[int] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if not entry.is_dir():
            raise DeviceDataError(f"{entry}: a file at the top of the image folder; expected "
                                  "one folder per class (<class>/<file>)")
        if entry.name not in label_of:
            raise DeviceDataError(f"{entry}: class folder {entry.name!r} is not among "
                                  f"device-classes ({', '.join(schema.class_names)})")
        for file in sorted(entry.iterdir()):
            if file.name.startswith("."):
                continue
            images.append(_decode(file, schema))
            labels.append(label_of[entry.name])
    if not images:
        raise DeviceDataError(f"{root}: no images (expected <class>/<file>.png or .jpg with "
                              f"classes among {', '.join(schema.class_names)})")
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def _decode(file: Path, schema: Schema) -> np.ndarray:
    """One image as uint8 HWC, checked against the schema's side and channels."""
    from PIL import Image

    if not file.is_file() or file.suffix.lower() not in IMAGE_SUFFIXES:
        raise DeviceDataError(f"{file}: not a PNG or JPEG file (expected <class>/<file> with "
                              f"suffix {' '.join(IMAGE_SUFFIXES)})")
    try:
        with Image.open(file) as image:
            image.load()
            mode, size = image.mode, image.size
            pixels = np.asarray(image, dtype=np.uint8)
    except Exception as error:  # Pillow raises many types for a damaged file
        raise DeviceDataError(f"{file}: cannot decode image ({_one_line(error)})") from None
    side, channels = schema.image_size, schema.in_channels
    if size != (side, side):
        raise DeviceDataError(f"{file}: image is {size[0]}x{size[1]}, the schema says "
                              f"{side}x{side} (device-image-size; images are not resized)")
    if mode not in MODES[channels]:
        raise DeviceDataError(f"{file}: image mode {mode!r}, the schema says {channels} "
                              f"channel(s) (device-channels; accepted modes: "
                              f"{', '.join(MODES[channels])})")
    return pixels.reshape(side, side, channels)


def _read_npz(file: Path, schema: Schema) -> tuple[np.ndarray, np.ndarray]:
    """``x`` (uint8, NHWC or NHW) and ``y`` (integer labels) of an array file, checked."""
    try:
        with np.load(file, allow_pickle=False) as npz:
            names = sorted(npz.files)
            if "x" not in names or "y" not in names:
                raise DeviceDataError(f"{file}: needs arrays 'x' and 'y', holds "
                                      f"{names or 'none'}")
            x, y = npz["x"], npz["y"]
    except DeviceDataError:
        raise
    except Exception as error:  # zip, pickle and format errors alike
        raise DeviceDataError(f"{file}: cannot read .npz ({_one_line(error)})") from None
    side, channels = schema.image_size, schema.in_channels
    if x.ndim == 3 and channels == 1:
        x = x[..., None]
    if x.dtype != np.uint8:
        raise DeviceDataError(f"{file}: x has dtype {x.dtype}, expected uint8")
    if x.ndim != 4 or x.shape[1:] != (side, side, channels):
        raise DeviceDataError(f"{file}: x has shape {tuple(x.shape)}, the schema says "
                              f"(N, {side}, {side}, {channels}) (device-image-size, "
                              "device-channels; NHW for 1 channel; images are not resized)")
    if len(x) == 0:
        raise DeviceDataError(f"{file}: no examples (x is empty)")
    if not np.issubdtype(y.dtype, np.integer) or y.shape != (len(x),):
        raise DeviceDataError(f"{file}: y must be {len(x)} integer labels, got "
                              f"{y.dtype} {tuple(y.shape)}")
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= schema.num_classes:
        raise DeviceDataError(f"{file}: labels span {lo}..{hi}, the schema has "
                              f"{schema.num_classes} classes (0..{schema.num_classes - 1})")
    return np.ascontiguousarray(x), y.astype(np.int64)


SPEC = DataSetSpec(NAME, None, (), check_present, None)
