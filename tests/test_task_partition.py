"""Partition tests on real Fashion-MNIST labels (skipped where the dataset is not installed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedinit.task.data_paths import default_data_dir
from fedinit.task.datasets import load_dataset
from fedinit.task.partition import (
    PARTITION_NAMES,
    dirichlet_equal_split,
    dirichlet_split,
    iid_split,
    label_skew,
    split,
)

FMNIST_DIR = str(default_data_dir("fashion-mnist"))


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    if not Path(FMNIST_DIR).is_dir():
        pytest.skip(f"Fashion-MNIST not at {FMNIST_DIR}")
    return np.asarray(load_dataset("fashion-mnist", FMNIST_DIR).train_y)


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("alpha", [0.1, 0.6])
def test_dirichlet_is_a_partition_with_no_empty_client(labels: np.ndarray, alpha: float) -> None:
    for seed in range(3):
        parts = dirichlet_split(labels, 100, alpha, seed)
        assert len(parts) == 100
        assert all(p.dtype == np.int64 and np.all(np.diff(p) > 0) for p in parts)  # sorted
        merged = np.sort(np.concatenate(parts))
        assert np.array_equal(merged, np.arange(labels.size))  # no loss, no duplicate
        assert min(p.size for p in parts) >= 1


def _dirichlet_reference(labels: np.ndarray, num_clients: int, alpha: float,
                         seed: int) -> list[np.ndarray]:
    """Hsu et al. as first written here: every draw split into chunks, then judged."""
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = []
    for _ in range(100):
        parts = [[] for _ in range(num_clients)]
        for cls in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == cls))
            proportions = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(proportions)[:-1] * members.size).astype(np.int64)
            for client, chunk in enumerate(np.split(members, cuts)):
                parts[client].append(chunk)
        if all(sum(c.size for c in chunks) > 0 for chunks in parts):
            break
    merged = [np.concatenate(chunks) for chunks in parts]
    for client, part in enumerate(merged):  # the repair of clients still empty
        if part.size == 0:
            donor = int(np.argmax([p.size for p in merged]))
            pick = int(rng.integers(merged[donor].size))
            merged[client] = merged[donor][pick : pick + 1].copy()
            merged[donor] = np.delete(merged[donor], pick)
    return [np.sort(p).astype(np.int64) for p in merged]


@pytest.mark.parametrize(("clients", "alpha", "seed"),
                         [(10, 0.1, 0), (100, 0.5, 1), (1000, 0.1, 0)])
def test_dirichlet_judges_draws_by_size_with_the_same_result(
        labels: np.ndarray, clients: int, alpha: float, seed: int) -> None:
    """Only the kept draw is split; the partition is the draw-by-draw one, bit for bit
    (1000 clients at alpha 0.1 use all 100 draws, then repair 5 empty clients: the path a
    2000-client cell took too, at twice the reference's cost)."""
    assert _same(dirichlet_split(labels, clients, alpha, seed),
                 _dirichlet_reference(labels, clients, alpha, seed))


def test_dirichlet_repairs_with_the_same_result_as_the_reference() -> None:
    labels = np.arange(20) % 2
    assert _same(dirichlet_split(labels, 20, 0.01, 0), _dirichlet_reference(labels, 20, 0.01, 0))


def test_dirichlet_repairs_empty_clients() -> None:
    # 20 samples over 20 clients with tiny alpha: redraws alone almost never succeed.
    labels = np.arange(20) % 2
    parts = dirichlet_split(labels, 20, 0.01, seed=0)
    assert all(p.size == 1 for p in parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(20))


def test_equal_variant_sizes(labels: np.ndarray) -> None:
    for n in (100, 7):
        parts = dirichlet_equal_split(labels, n, 0.1, seed=0)
        assert len(parts) == n
        assert {p.size for p in parts} == {labels.size // n}
        assert all(np.all(np.diff(p) >= 0) for p in parts)


def test_equal_variant_samples_with_replacement(labels: np.ndarray) -> None:
    merged = np.concatenate(dirichlet_equal_split(labels, 100, 0.01, seed=0))
    duplicates = merged.size - np.unique(merged).size
    print(f"dirichlet-equal alpha 0.01: {duplicates} duplicated indices of {merged.size}")
    assert duplicates > 1000


@pytest.mark.parametrize("scheme", PARTITION_NAMES)
def test_reproducible_and_seed_dependent(labels: np.ndarray, scheme: str) -> None:
    first = split(labels, scheme, 50, 0.3, seed=11)
    assert _same(first, split(labels, scheme, 50, 0.3, seed=11))
    assert not _same(first, split(labels, scheme, 50, 0.3, seed=12))


def test_skew_orders_alphas(labels: np.ndarray) -> None:
    for scheme in ("dirichlet", "dirichlet-equal"):
        strong = np.mean(
            [label_skew(labels, split(labels, scheme, 100, 0.1, s), 10) for s in (0, 1)]
        )
        mild = np.mean([label_skew(labels, split(labels, scheme, 100, 0.6, s), 10) for s in (0, 1)])
        iid = label_skew(labels, iid_split(labels, 100, 0), 10)
        print(f"{scheme}: skew alpha 0.1 = {strong:.3f}, alpha 0.6 = {mild:.3f}, iid = {iid:.3f}")
        assert strong > mild + 0.15
        assert mild > iid + 0.2


def test_iid_sizes() -> None:
    labels = np.arange(103) % 10
    parts = iid_split(labels, 10, seed=0)
    assert {p.size for p in parts} == {10, 11}
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(103))


def test_label_skew_extremes() -> None:
    labels = np.repeat(np.arange(4), 5)
    by_class = [np.flatnonzero(labels == c) for c in range(4)]
    assert label_skew(labels, by_class, 4) == pytest.approx(0.75)
    assert label_skew(labels, [np.arange(20)], 4) == pytest.approx(0.0)


def test_bad_arguments() -> None:
    labels = np.arange(10) % 2
    with pytest.raises(ValueError, match="'shards'.*dirichlet, dirichlet-equal, iid"):
        split(labels, "shards", 2, 0.1, 0)
    with pytest.raises(ValueError, match="alpha must be a positive"):
        split(labels, "dirichlet", 2, 0.0, 0)
    with pytest.raises(ValueError, match=r"num_clients must be in 1\.\.10"):
        split(labels, "iid", 11, 0.1, 0)
    with pytest.raises(ValueError, match="integer array"):
        split(labels.astype(float), "iid", 2, 0.1, 0)
