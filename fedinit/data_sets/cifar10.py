"""CIFAR-10: the offline JPEG copy (tarball, a folder holding it, or its extraction) or
torchvision's cifar-10-batches-py pickles. Decoding 60k JPEGs is slow, so the decoded arrays
are cached (compressed .npz under $FEDINIT_CACHE_DIR, keyed by the source's size and mtime).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
import warnings
import zlib
from pathlib import Path

import numpy as np

from fedinit.data_sets.cifar_files import check_label_range, find_pickle_dir, read_cifar_pickle
from fedinit.data_sets.spec import (
    DataFormatError,
    DataNotFoundError,
    DataSetSpec,
    DataSplits,
    Schema,
)
from fedinit.store.files import atomic_write

NAME = "cifar10"
# Per-pixel statistics of the original CIFAR training set (the JPEG copy's std is a bit lower).
SCHEMA = Schema(num_classes=10, in_channels=3, image_size=32,
                mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616))
JPEG_TARBALL = "cifar10-jpg.tar.gz"
HINT = (
    f"pass data-dir=<the JPEG tarball {JPEG_TARBALL}, a folder holding it or its "
    "extracted train/ and test/ folders>, or download it with "
    "torchvision.datasets.CIFAR10(root=DIR, download=True) and pass data-dir=DIR"
)
_REPO = Path(__file__).resolve().parents[3]
CANDIDATES = (_REPO / "data" / "cifar10", _REPO.parent / "shared" / "data")
"""``../shared/data`` (next to the checkout) is where the offline JPEG copy sits on the
project's machines."""

CACHE_ENV = "FEDINIT_CACHE_DIR"
CACHE_VERSION = 1

_JPEG_MEMBER = re.compile(r"(?:^|/)(train|test)/([^/]+)/([^/]+\.jpe?g)$", re.IGNORECASE)


def find_jpeg_root(path: Path) -> Path | None:
    """Return the folder holding train/ and test/ (itself or its only subfolder)."""
    if (path / "train").is_dir() and (path / "test").is_dir():
        return path
    subfolders = [p for p in path.iterdir() if p.is_dir()]
    if len(subfolders) == 1 and (subfolders[0] / "train").is_dir():
        return subfolders[0] if (subfolders[0] / "test").is_dir() else None
    return None


def check_present(path: Path) -> None:
    """One of the accepted layouts is there (not read)."""
    if not path.exists():
        raise DataNotFoundError(f"cifar10 not found: no file or directory {path}; {HINT}")
    if path.is_dir() and not (find_pickle_dir(path, "cifar-10-batches-py", "data_batch_1")
                              or (path / JPEG_TARBALL).is_file()
                              or find_jpeg_root(path)):
        raise DataNotFoundError(
            f"cifar10 not found: {path} holds neither {JPEG_TARBALL}, train/ and "
            f"test/ folders, nor cifar-10-batches-py; {HINT}")


def load(path: Path) -> DataSplits:
    """Find CIFAR-10 at `path`: the JPEG tarball, a folder with it or its extraction, or pickles."""
    check_present(path)
    if path.is_file():
        arrays = _cached_jpeg_decode(path)
    else:
        pickle_dir = find_pickle_dir(path, "cifar-10-batches-py", "data_batch_1")
        if pickle_dir is not None:
            arrays = _read_pickles(pickle_dir)
        elif (path / JPEG_TARBALL).is_file():
            arrays = _cached_jpeg_decode(path / JPEG_TARBALL)
        else:
            jpeg_root = find_jpeg_root(path)
            assert jpeg_root is not None  # check_present found one of the three
            arrays = _cached_jpeg_decode(jpeg_root)
    train_x, train_y, test_x, test_y = arrays
    s = SCHEMA
    return DataSplits(train_x, train_y, test_x, test_y, s.num_classes, s.in_channels, s.mean,
                      s.std)


def _read_pickles(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Read data_batch_1..5 and test_batch from torchvision's cifar-10-batches-py."""
    parts = []
    for index in range(1, 6):
        file = folder / f"data_batch_{index}"
        if not file.is_file():
            raise DataNotFoundError(f"cifar10 not found: {file} is missing; {HINT}")
        parts.append(read_cifar_pickle(file, "labels"))
    test_file = folder / "test_batch"
    if not test_file.is_file():
        raise DataNotFoundError(f"cifar10 not found: {test_file} is missing; {HINT}")
    test_x, test_y = read_cifar_pickle(test_file, "labels")
    train_x = np.concatenate([x for x, _ in parts])
    train_y = np.concatenate([y for _, y in parts])
    check_label_range([train_y, test_y], 10, folder)
    return train_x, train_y, test_x, test_y


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
    parts.append(f"v{CACHE_VERSION}")
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


SPEC = DataSetSpec(NAME, SCHEMA, CANDIDATES, check_present, load)
