"""CIFAR-100 (fine labels): torchvision's cifar-100-python pickles."""

from __future__ import annotations

from pathlib import Path

from fedinit.data_sets.cifar_files import check_label_range, find_pickle_dir, read_cifar_pickle
from fedinit.data_sets.spec import DataNotFoundError, DataSetSpec, DataSplits, Schema

NAME = "cifar100"
SCHEMA = Schema(num_classes=100, in_channels=3, image_size=32,
                mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762))
HINT = ("download it with torchvision.datasets.CIFAR100(root=DIR, download=True) and pass "
        "data-dir=DIR (no offline copy exists)")
CANDIDATES = (Path(__file__).resolve().parents[3] / "data" / "cifar100",)


def check_present(path: Path) -> None:
    """The cifar-100-python folder is there (not read)."""
    if not path.exists():
        raise DataNotFoundError(f"cifar100 not found: no file or directory {path}; {HINT}")
    if not path.is_dir() or find_pickle_dir(path, "cifar-100-python", "train") is None:
        raise DataNotFoundError(f"cifar100 not found: {path} holds no cifar-100-python "
                                f"folder; {HINT}")


def load(path: Path) -> DataSplits:
    """Read torchvision's cifar-100-python pickles (fine labels) from `path`."""
    check_present(path)
    folder = find_pickle_dir(path, "cifar-100-python", "train")
    assert folder is not None  # check_present found it
    train_x, train_y = read_cifar_pickle(folder / "train", "fine_labels")
    test_x, test_y = read_cifar_pickle(folder / "test", "fine_labels")
    check_label_range([train_y, test_y], 100, folder)
    s = SCHEMA
    return DataSplits(train_x, train_y, test_x, test_y, s.num_classes, s.in_channels, s.mean,
                      s.std)


SPEC = DataSetSpec(NAME, SCHEMA, CANDIDATES, check_present, load)
