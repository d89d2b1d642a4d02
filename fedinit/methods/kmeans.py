"""Seeded k-means of clients' (sketched, unit-length) updates, shared by clustered FL's
k-means assignment (``fedinit.methods.clustered``) and its choice of the cluster count
(``fedinit.methods.cluster_count``): a module of its own, so neither imports the other."""

from __future__ import annotations

import numpy as np

KMEANS_ITER = 20
"""Lloyd iterations per k-means start."""


def kmeans(points: np.ndarray, k: int, seed: int, restarts: int = 1) -> np.ndarray:
    """Cluster labels of ``points`` by scipy's k-means (k-means++ start, seeded); with
    ``restarts`` > 1 the best of that many starts: no empty cluster first, then the least
    within-cluster sum of squares (ties: the first start)."""
    import warnings

    from scipy.cluster.vq import kmeans2

    x = points.astype(np.float64)
    best: tuple[int, float] | None = None
    chosen = np.zeros(len(x), dtype=np.int64)
    for start in range(restarts):
        rng = np.random.default_rng(seed if restarts == 1 else [seed, start])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an empty cluster: counted below
            centroids, labels = kmeans2(x, k, iter=KMEANS_ITER, minit="++", seed=rng,
                                        missing="warn")
        labels = np.asarray(labels, dtype=np.int64)
        score = (k - len(np.unique(labels)), float(((x - centroids[labels]) ** 2).sum()))
        if best is None or score < best:
            best, chosen = score, labels
    return chosen
