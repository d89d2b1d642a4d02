"""Fashion-MNIST: the four IDX files (gzipped or not), flat or in torchvision's layout."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from fedinit.data_sets.spec import (
    DataFormatError,
    DataNotFoundError,
    DataSetSpec,
    DataSplits,
    Schema,
)

NAME = "fashion-mnist"
SCHEMA = Schema(num_classes=10, in_channels=1, image_size=28, mean=(0.2860,), std=(0.3530,))
HINT = "install it with: apt-get install -y dataset-fashion-mnist"
FILES: dict[str, str] = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}
CANDIDATES = (Path("/usr/share/datasets/fashion-mnist"),)  # the Debian package


def folders(path: Path) -> list[Path]:
    """The folders that may hold the IDX files: ``path`` or torchvision's layout under it."""
    return [path, path / "FashionMNIST" / "raw"]


def find_idx_file(candidates: list[Path], stem: str) -> Path | None:
    """Return the first existing `stem.gz` or `stem` in `candidates`."""
    for folder in candidates:
        for candidate in (folder / f"{stem}.gz", folder / stem):
            if candidate.is_file():
                return candidate
    return None


def check_present(path: Path) -> None:
    """Every IDX file is there (not read)."""
    if not path.is_dir():
        raise DataNotFoundError(f"fashion-mnist not found: no directory {path}; {HINT}")
    for stem in FILES.values():
        if find_idx_file(folders(path), stem) is None:
            raise DataNotFoundError(f"fashion-mnist not found: {path / (stem + '.gz')} is "
                                    f"missing; {HINT}")


def load(path: Path) -> DataSplits:
    """Read the four IDX files, gzipped or not, from `path` (or torchvision's FashionMNIST/raw)."""
    check_present(path)
    arrays: dict[str, np.ndarray] = {}
    for key, stem in FILES.items():
        file = find_idx_file(folders(path), stem)
        assert file is not None  # check_present found it
        arrays[key] = read_idx(file, expected_ndim=3 if key.endswith("_x") else 1)
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
        num_classes=SCHEMA.num_classes,
        in_channels=SCHEMA.in_channels,
        mean=SCHEMA.mean,
        std=SCHEMA.std,
    )


def read_idx(file: Path, expected_ndim: int) -> np.ndarray:
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


SPEC = DataSetSpec(NAME, SCHEMA, CANDIDATES, check_present, load)
