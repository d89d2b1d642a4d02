"""Clients in a few regimes: each regime sees the data set rotated or relabelled its own way.

A personalization benchmark (issue 24): with ``num-regimes`` R > 0 every client belongs to
one of R regimes, and all its examples (local train and local test split alike) are
transformed the regime's way: ``rotate`` turns images by 90 * r degrees (np.rot90,
counter-clockwise), ``permute-labels`` relabels class c as perm_r[c]. Regime 0 is the
identity in both kinds, so the central test set (untransformed) is regime 0's task. Which
examples a client holds is still decided by ``partition`` (Dirichlet, iid, ...); the regime
only decides how they look. Everything is a pure function of (seed, num-clients, R), so the
server, a simulation and a deployed client (from run config + partition id) agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedinit.config.choices import MAX_ROTATIONS, REGIME_KINDS

ASSIGN_STREAM = 21
"""Seed-sequence word of the client -> regime assignment (apart from every other draw)."""
PERMUTE_STREAM = 22
"""Seed-sequence word of the regimes' label permutations."""


def client_regimes(num_clients: int, num_regimes: int, seed: int) -> np.ndarray:
    """Each client's regime (0..R-1), balanced (sizes differ by at most one) and seeded:
    a seeded permutation of the clients dealt round-robin into the regimes."""
    if num_regimes < 1 or num_regimes > num_clients:
        raise ValueError(f"num_regimes must be in 1..{num_clients} (num-clients), "
                         f"got {num_regimes}")
    order = np.random.default_rng([seed, ASSIGN_STREAM]).permutation(num_clients)
    regimes = np.empty(num_clients, dtype=np.int64)
    regimes[order] = np.arange(num_clients) % num_regimes
    return regimes


def label_permutation(num_classes: int, regime: int, seed: int) -> np.ndarray:
    """Regime ``regime``'s relabelling: class c becomes perm[c]. The identity for regime 0;
    for the others a seeded permutation other than the identity (redrawn if it is one)."""
    if num_classes < 2:
        raise ValueError(f"label permutation needs at least 2 classes, got {num_classes}")
    if regime < 0:
        raise ValueError(f"regime must be >= 0, got {regime}")
    identity = np.arange(num_classes, dtype=np.int64)
    if regime == 0:
        return identity
    rng = np.random.default_rng([seed, PERMUTE_STREAM, regime])
    perm = rng.permutation(num_classes)
    while np.array_equal(perm, identity):
        perm = rng.permutation(num_classes)
    return perm.astype(np.int64)


def rotate(x: np.ndarray, regime: int) -> np.ndarray:
    """Images (N, H, W, C) turned counter-clockwise by 90 * regime degrees (a contiguous copy)."""
    if x.ndim != 4 or x.shape[1] != x.shape[2]:
        raise ValueError(f"rotation needs square images (N, H, W, C), got shape {x.shape}")
    return np.ascontiguousarray(np.rot90(x, k=regime % MAX_ROTATIONS, axes=(1, 2)))


def apply_regime(x: np.ndarray, y: np.ndarray, kind: str, regime: int, num_classes: int,
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One client's (images, labels) as its regime sees them."""
    if kind == "rotate":
        return rotate(x, regime), y
    if kind == "permute-labels":
        return x, label_permutation(num_classes, regime, seed)[np.asarray(y, dtype=np.int64)]
    raise ValueError(f"unknown regime kind {kind!r}; allowed: {', '.join(REGIME_KINDS)}")


def describe(kind: str, regime: int, num_classes: int, seed: int) -> str:
    """A regime's transform in words, for the results' regimes.csv."""
    if kind == "rotate":
        return f"rot{90 * (regime % MAX_ROTATIONS)}"
    perm = label_permutation(num_classes, regime, seed)
    return "labels " + " ".join(str(int(p)) for p in perm)


def same_regime_edges(regimes: Sequence[int] | np.ndarray,
                      weight: float = 1.0) -> list[tuple[int, int, float]]:
    """The given graph of a regimes data set: every pair of clients i < j in the same regime,
    joined with ``weight`` (the clients of one regime form a clique, regimes are apart)."""
    if not (np.isfinite(weight) and weight > 0):
        raise ValueError(f"edge weight must be a positive finite number, got {weight}")
    r = np.asarray(regimes, dtype=np.int64)
    return [(i, j, float(weight)) for i in range(r.size) for j in range(i + 1, r.size)
            if r[i] == r[j]]
