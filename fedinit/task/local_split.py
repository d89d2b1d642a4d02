"""Each client's own test split: part of its partition held out for personalized evaluation.

A pure function of (the partition's labels, fraction, seed, partition id), so a simulation,
a deployment and the server (which checks the example counts replies claim) all compute the
same split. Stratified: every class gets its share rounded down, and the test set is topped
up to round(fraction * n) from the classes with the largest remainders (ties broken by the
seed), so each class's test count is within one of fraction * its count.
"""

from __future__ import annotations

import numpy as np

SPLIT_STREAM = 11
"""Seed-sequence word that separates the split's draws from the partition's and the noise's."""


def local_test_count(n: int, fraction: float) -> int:
    """How many of a partition's ``n`` examples its test split holds: round(fraction * n),
    leaving at least one training example (the server counts every client's training
    examples from this without drawing the split)."""
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"local test fraction must be in [0, 1), got {fraction}")
    return max(0, min(int(round(fraction * n)), n - 1))


def local_test_positions(labels: np.ndarray, fraction: float, seed: int,
                         partition_id: int) -> np.ndarray:
    """Sorted positions (into ``labels``) of the client's test examples; empty at fraction 0.

    A client always keeps at least one training example, so a one-example client has no
    test split (it is then left out of personalized evaluation).
    """
    labels = np.asarray(labels, dtype=np.int64)
    target = local_test_count(labels.size, fraction)
    if target == 0:
        return np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng([seed, partition_id, SPLIT_STREAM])
    classes, counts = np.unique(labels, return_counts=True)
    exact = fraction * counts
    take = np.floor(exact).astype(np.int64)
    # largest remainders first; a random key breaks ties reproducibly
    order = np.lexsort((rng.random(classes.size), -(exact - take)))
    for i in order[: max(0, target - int(take.sum()))]:
        take[i] += 1
    picked = [rng.permutation(np.flatnonzero(labels == cls))[:k]
              for cls, k in zip(classes, take, strict=True)]
    return np.sort(np.concatenate(picked)).astype(np.int64)


def split_positions(labels: np.ndarray, fraction: float, seed: int,
                    partition_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(train positions, test positions): disjoint, together every position once."""
    test = local_test_positions(labels, fraction, seed, partition_id)
    train = np.setdiff1d(np.arange(np.asarray(labels).size), test, assume_unique=True)
    return train.astype(np.int64), test
