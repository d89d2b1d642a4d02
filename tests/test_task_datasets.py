"""Dataset tests: real Fashion-MNIST and CIFAR-10 JPEG copy, synthetic files for other formats."""

from __future__ import annotations

import gzip
import importlib
import io
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from fedinit.data_sets import DEVICE, HOMES, SPECS
from fedinit.task.data_paths import CIFAR10_JPEG_TARBALL, default_data_dir
from fedinit.task.datasets import (
    DataFormatError,
    DataNotFoundError,
    load_dataset,
    to_tensor,
)

REPO = Path(__file__).resolve().parents[1]
FMNIST_DIR = default_data_dir("fashion-mnist")
CIFAR10_TARBALL = default_data_dir("cifar10") / CIFAR10_JPEG_TARBALL
FMNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def _idx_bytes(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + array.astype(np.uint8).tobytes()


def _write_tiny_idx(folder: Path, compress: bool) -> None:
    rng = np.random.default_rng(0)
    arrays = [
        rng.integers(0, 256, (6, 28, 28)),
        np.arange(6) % 10,
        rng.integers(0, 256, (4, 28, 28)),
        np.arange(4),
    ]
    folder.mkdir(parents=True, exist_ok=True)
    for stem, array in zip(FMNIST_FILES, arrays, strict=True):
        data = _idx_bytes(array)
        if compress:
            (folder / f"{stem}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / stem).write_bytes(data)


def _one_line(error: BaseException) -> str:
    text = str(error)
    assert "\n" not in text
    return text


@pytest.mark.skipif(not FMNIST_DIR.is_dir(), reason=f"Fashion-MNIST not at {FMNIST_DIR}")
def test_fashion_mnist_real() -> None:
    data = load_dataset("fashion-mnist", str(FMNIST_DIR))
    assert data.train_x.shape == (60000, 28, 28, 1) and data.train_x.dtype == np.uint8
    assert data.test_x.shape == (10000, 28, 28, 1)
    assert data.train_y.dtype == np.int64 and data.test_y.dtype == np.int64
    assert data.train_y.min() == 0 and data.train_y.max() == 9
    assert np.all(np.bincount(data.train_y) == 6000)
    assert np.all(np.bincount(data.test_y) == 1000)
    assert (data.num_classes, data.in_channels) == (10, 1)
    assert abs(float(data.train_x[:5000].mean()) / 255 - data.mean[0]) < 0.01
    assert load_dataset("fashion-mnist", str(FMNIST_DIR)) is data  # cached in-process
    assert not data.train_x.flags.writeable  # the shared cached copy is protected


def test_fashion_mnist_plain_and_gz_names(tmp_path: Path) -> None:
    _write_tiny_idx(tmp_path / "gz", compress=True)
    _write_tiny_idx(tmp_path / "plain", compress=False)
    a = load_dataset("fashion-mnist", str(tmp_path / "gz"))
    b = load_dataset("fashion-mnist", str(tmp_path / "plain"))
    assert a.train_x.shape == (6, 28, 28, 1) and a.test_y.tolist() == [0, 1, 2, 3]
    assert np.array_equal(a.train_x, b.train_x)


def test_fashion_mnist_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError) as info:
        load_dataset("fashion-mnist", str(tmp_path / "nowhere"))
    text = _one_line(info.value)
    assert "fashion-mnist" in text and "nowhere" in text
    assert "apt-get install -y dataset-fashion-mnist" in text
    assert isinstance(info.value, FileNotFoundError)


@pytest.mark.skipif(not FMNIST_DIR.is_dir(), reason=f"Fashion-MNIST not at {FMNIST_DIR}")
def test_fashion_mnist_truncated_gz(tmp_path: Path) -> None:
    for stem in FMNIST_FILES:
        (tmp_path / f"{stem}.gz").symlink_to(FMNIST_DIR / f"{stem}.gz")
    (tmp_path / "train-labels-idx1-ubyte.gz").unlink()
    full = (FMNIST_DIR / "train-labels-idx1-ubyte.gz").read_bytes()
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(full[: len(full) // 2])
    with pytest.raises(DataFormatError) as info:
        load_dataset("fashion-mnist", str(tmp_path))
    assert "train-labels-idx1-ubyte.gz" in _one_line(info.value)
    assert isinstance(info.value, ValueError)


def test_idx_bad_magic_and_short_data(tmp_path: Path) -> None:
    _write_tiny_idx(tmp_path, compress=False)
    labels = tmp_path / "t10k-labels-idx1-ubyte"
    labels.write_bytes(b"\x00\x00\x09\x01" + labels.read_bytes()[4:])
    with pytest.raises(DataFormatError, match="bad magic"):
        load_dataset("fashion-mnist", str(tmp_path))
    labels.write_bytes(_idx_bytes(np.arange(4))[:-1])
    with pytest.raises(DataFormatError, match="need 4 data bytes, found 3"):
        load_dataset("fashion-mnist", str(tmp_path))


@pytest.mark.slow  # a fresh cache (CI's) decodes 60k JPEGs: ~20 s; the format is covered fast below
@pytest.mark.skipif(not CIFAR10_TARBALL.is_file(), reason=f"no CIFAR-10 copy at {CIFAR10_TARBALL}")
def test_cifar10_jpeg_tarball() -> None:
    # The first call in a fresh cache decodes 60k JPEGs (~25 s); later ones read the .npz cache.
    data = load_dataset("cifar10", str(CIFAR10_TARBALL))
    assert data.train_x.shape == (50000, 32, 32, 3) and data.train_x.dtype == np.uint8
    assert data.test_x.shape == (10000, 32, 32, 3)
    assert np.all(np.bincount(data.train_y) == 5000)
    assert np.all(np.bincount(data.test_y) == 1000)
    assert (data.num_classes, data.in_channels) == (10, 3)
    means = data.test_x.reshape(-1, 3).mean(axis=0) / 255
    assert np.allclose(means, data.mean, atol=0.02)


def _write_jpeg_tree(root: Path, per_class: int) -> None:
    from PIL import Image

    classes = [f"c{index}" for index in range(10)]
    for split in ("train", "test"):
        for label, name in enumerate(classes):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(per_class):
                pixels = np.full((32, 32, 3), 20 * label + index, dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{index:04d}.jpg", quality=95)


def test_cifar10_jpeg_tree_and_tar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDINIT_CACHE_DIR", str(tmp_path / "cache"))
    tree = tmp_path / "extracted"
    _write_jpeg_tree(tree / "cifar10", per_class=2)
    tarball = tmp_path / "tar" / "cifar10-jpg.tar.gz"
    tarball.parent.mkdir()
    with tarfile.open(tarball, "w:gz") as archive:
        archive.add(tree / "cifar10", arcname="top")  # with a top-level folder
    from_tree = load_dataset("cifar10", str(tree))  # the folder above train/ and test/
    from_tar = load_dataset("cifar10", str(tarball))
    from_dir = load_dataset("cifar10", str(tarball.parent))  # a folder holding the tarball
    for data in (from_tree, from_tar, from_dir):
        assert data.train_x.shape == (20, 32, 32, 3) and data.test_x.shape == (20, 32, 32, 3)
        assert data.train_y.tolist() == [c for c in range(10) for _ in range(2)]
        assert abs(int(data.train_x[5, 0, 0, 0]) - 41) <= 2  # class 2, image 1: JPEG-lossy 41
    assert np.array_equal(from_tree.train_x, from_tar.train_x)
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2  # tree and tarball keys
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_cifar10_truncated_tarball(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FEDINIT_CACHE_DIR", str(tmp_path / "cache"))
    _write_jpeg_tree(tmp_path / "tree", per_class=3)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(tmp_path / "tree", arcname=".")
    broken = tmp_path / "cifar10-jpg.tar.gz"
    broken.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    with pytest.raises(DataFormatError) as info:
        load_dataset("cifar10", str(broken))
    assert str(broken) in _one_line(info.value)


def test_cifar10_missing(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError) as info:
        load_dataset("cifar10", str(tmp_path / "absent"))
    text = _one_line(info.value)
    assert "cifar10" in text and "absent" in text
    assert "cifar10-jpg.tar.gz" in text and "download=True" in text


def _write_pickle(file: Path, payload: dict[object, object]) -> None:
    file.parent.mkdir(parents=True, exist_ok=True)
    with open(file, "wb") as handle:
        pickle.dump(payload, handle)


def _batch(n: int, start: int, label_key: str, classes: int, byte_keys: bool) -> dict:
    data = (np.arange(n * 3072) % 251).astype(np.uint8).reshape(n, 3072)
    data[:, 0] = start + np.arange(n)  # pixel (0, 0) of the red channel tags the image
    labels = [(start + i) % classes for i in range(n)]
    if byte_keys:
        return {b"data": data, label_key.encode(): labels}
    return {"data": data, label_key: labels}


def test_cifar10_pickles(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    for index in range(1, 6):
        _write_pickle(
            folder / f"data_batch_{index}", _batch(3, 3 * (index - 1), "labels", 10, index % 2 == 0)
        )
    _write_pickle(folder / "test_batch", _batch(2, 100, "labels", 10, True))
    for path in (tmp_path, folder):
        data = load_dataset("cifar10", str(path))
        assert data.train_x.shape == (15, 32, 32, 3) and data.test_x.shape == (2, 32, 32, 3)
        assert data.train_x[:, 0, 0, 0].tolist() == list(range(15))  # CHW -> HWC, batch order
        assert data.train_y.tolist() == [i % 10 for i in range(15)]
        assert data.train_y.dtype == np.int64


def test_cifar100_pickles_and_missing(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    _write_pickle(folder / "train", _batch(5, 95, "fine_labels", 100, True))
    _write_pickle(folder / "test", _batch(2, 0, "fine_labels", 100, True))
    data = load_dataset("cifar100", str(tmp_path))
    assert (data.num_classes, data.in_channels) == (100, 3)
    assert data.train_y.tolist() == [95, 96, 97, 98, 99]
    assert data.train_x.shape == (5, 32, 32, 3)
    with pytest.raises(DataNotFoundError) as info:
        load_dataset("cifar100", str(tmp_path / "absent"))
    text = _one_line(info.value)
    assert "cifar100" in text and "CIFAR100" in text
    (folder / "test").write_bytes(b"not a pickle")
    with pytest.raises(DataFormatError, match="cannot unpickle"):
        load_dataset("cifar100", str(folder))


def test_unknown_dataset() -> None:
    with pytest.raises(ValueError, match="'mnist'.*fashion-mnist, cifar10, cifar100"):
        load_dataset("mnist", ".")


def test_to_tensor() -> None:
    x = np.zeros((2, 4, 5, 3), dtype=np.uint8)
    x[..., 1] = 255
    x.flags.writeable = False  # the cached arrays are read-only
    t = to_tensor(x, (0.5, 0.5, 0.0), (0.5, 0.25, 1.0))
    assert t.dtype == torch.float32 and t.shape == (2, 3, 4, 5)
    assert torch.allclose(t[:, 0], torch.full((2, 4, 5), -1.0))
    assert torch.allclose(t[:, 1], torch.full((2, 4, 5), 2.0))
    assert torch.allclose(t[:, 2], torch.zeros(2, 4, 5))
    with pytest.raises(ValueError, match="channels"):
        to_tensor(x, (0.5,), (0.5,))


def test_the_registry_loads_a_data_sets_module_on_first_use() -> None:
    """A Fashion-MNIST config loads Fashion-MNIST's module, not the CIFAR readers nor device
    data's; each name's module holds that name's spec."""
    probe = ("import sys\nfrom fedinit.config import RunConfig\n"
             "RunConfig.parse({'dataset': 'fashion-mnist'})\n"
             "print(sorted(m for m in sys.modules if m.startswith('fedinit.data_sets.')))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert out == ["['fedinit.data_sets.fashion_mnist', 'fedinit.data_sets.spec']"], out
    for name, home in HOMES.items():
        assert SPECS[name] is importlib.import_module(f"fedinit.data_sets.{home}").SPEC
    assert importlib.import_module("fedinit.data_sets.device").NAME == DEVICE
