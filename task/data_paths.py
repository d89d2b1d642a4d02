"""Where each data set lives and whether it is there, without reading it.

Standard library only, so that the config check and ``fedinit-simulate`` can refuse a missing
data set in milliseconds, before torch, Ray or any SuperNode starts. ``task.datasets`` reads
the files through the same finders, so "present" here means "loadable" there (up to damage).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

DATASET_NAMES: tuple[str, ...] = ("fashion-mnist", "cifar10", "cifar100")
IMAGE_SIZES: dict[str, int] = {"fashion-mnist": 28, "cifar10": 32, "cifar100": 32}
"""Side of each data set's square images (what a model must accept; checked by the config)."""

CIFAR10_JPEG_TARBALL = "cifar10-jpg.tar.gz"
FASHION_FILES: dict[str, str] = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}

DEFAULT_DATA_CANDIDATES: dict[str, tuple[Path, ...]] = {
    "fashion-mnist": (Path("/usr/share/datasets/fashion-mnist"),),  # the Debian package
    "cifar10": (REPO / "data" / "cifar10", REPO.parent / "shared" / "data"),
    "cifar100": (REPO / "data" / "cifar100",),
}
"""Where ``data-dir=""`` looks, in order: the first that holds the data set wins, else the
first is reported. ``../shared/data`` (next to the checkout) is where the offline CIFAR-10
JPEG copy sits on the project's machines."""

FASHION_HINT = "install it with: apt-get install -y dataset-fashion-mnist"
CIFAR10_HINT = (
    f"pass data-dir=<the JPEG tarball {CIFAR10_JPEG_TARBALL}, a folder holding it or its "
    "extracted train/ and test/ folders>, or download it with "
    "torchvision.datasets.CIFAR10(root=DIR, download=True) and pass data-dir=DIR"
)
CIFAR100_HINT = (
    "download it with torchvision.datasets.CIFAR100(root=DIR, download=True) and pass "
    "data-dir=DIR (no offline copy exists)"
)


class DataNotFoundError(FileNotFoundError):
    """The dataset is not at the given path; the message says how to get it."""


def find_idx_file(folders: list[Path], stem: str) -> Path | None:
    """Return the first existing `stem.gz` or `stem` in `folders`."""
    for folder in folders:
        for candidate in (folder / f"{stem}.gz", folder / stem):
            if candidate.is_file():
                return candidate
    return None


def fashion_folders(path: Path) -> list[Path]:
    """The folders that may hold the IDX files: ``path`` or torchvision's layout under it."""
    return [path, path / "FashionMNIST" / "raw"]


def find_pickle_dir(path: Path, folder_name: str, marker: str) -> Path | None:
    """Accept either torchvision's root (holding `folder_name`) or that folder itself."""
    for candidate in (path / folder_name, path):
        if (candidate / marker).is_file():
            return candidate
    return None


def find_jpeg_root(path: Path) -> Path | None:
    """Return the folder holding train/ and test/ (itself or its only subfolder)."""
    if (path / "train").is_dir() and (path / "test").is_dir():
        return path
    subfolders = [p for p in path.iterdir() if p.is_dir()]
    if len(subfolders) == 1 and (subfolders[0] / "train").is_dir():
        return subfolders[0] if (subfolders[0] / "test").is_dir() else None
    return None


def check_present(name: str, path: Path) -> None:
    """Raise DataNotFoundError (with how to get it) unless data set ``name`` is at ``path``."""
    if name == "fashion-mnist":
        if not path.is_dir():
            raise DataNotFoundError(f"fashion-mnist not found: no directory {path}; "
                                    f"{FASHION_HINT}")
        for stem in FASHION_FILES.values():
            if find_idx_file(fashion_folders(path), stem) is None:
                raise DataNotFoundError(f"fashion-mnist not found: {path / (stem + '.gz')} is "
                                        f"missing; {FASHION_HINT}")
    elif name == "cifar10":
        if not path.exists():
            raise DataNotFoundError(f"cifar10 not found: no file or directory {path}; "
                                    f"{CIFAR10_HINT}")
        if path.is_dir() and not (find_pickle_dir(path, "cifar-10-batches-py", "data_batch_1")
                                  or (path / CIFAR10_JPEG_TARBALL).is_file()
                                  or find_jpeg_root(path)):
            raise DataNotFoundError(
                f"cifar10 not found: {path} holds neither {CIFAR10_JPEG_TARBALL}, train/ and "
                f"test/ folders, nor cifar-10-batches-py; {CIFAR10_HINT}")
    elif name == "cifar100":
        if not path.exists():
            raise DataNotFoundError(f"cifar100 not found: no file or directory {path}; "
                                    f"{CIFAR100_HINT}")
        if not path.is_dir() or find_pickle_dir(path, "cifar-100-python", "train") is None:
            raise DataNotFoundError(f"cifar100 not found: {path} holds no cifar-100-python "
                                    f"folder; {CIFAR100_HINT}")
    else:
        raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(DATASET_NAMES)}")


def default_data_dir(name: str) -> Path:
    """The first default location of ``name`` that holds it, else its first candidate."""
    candidates = DEFAULT_DATA_CANDIDATES[name]
    for path in candidates:
        try:
            check_present(name, path)
        except DataNotFoundError:
            continue
        return path
    return candidates[0]
