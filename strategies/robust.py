"""How the round's uploads are combined: weighted mean, or a robust statistic.

Median and trimmed mean work coordinate by coordinate and ignore the example weights (a
client cannot buy influence by claiming more examples). They bound what a few bad but
well-formed replies can do that the reply checks in ``shell.MethodStrategy`` cannot catch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from strategies.ri import Weights, weighted_mean


def coordinate_median(vectors: Sequence[Weights]) -> Weights:
    """Coordinate-wise median of model-shaped vectors."""
    return [np.median(np.stack([v[i] for v in vectors]), axis=0).astype(np.float32)
            for i in range(len(vectors[0]))]


def trimmed_mean(vectors: Sequence[Weights], trim: float) -> Weights:
    """Coordinate-wise mean after dropping floor(trim * n) values at each end."""
    n = len(vectors)
    k = int(trim * n)
    out = []
    for i in range(len(vectors[0])):
        stacked = np.sort(np.stack([v[i].astype(np.float64) for v in vectors]), axis=0)
        out.append(stacked[k:n - k].mean(axis=0).astype(np.float32))
    return out


def combine(vectors: Sequence[Weights], weights: Sequence[float], kind: str,
            trim: float) -> Weights:
    """The configured combination (``aggregation`` key) of the round's uploads."""
    if kind == "median":
        return coordinate_median(vectors)
    if kind == "trimmed-mean":
        return trimmed_mean(vectors, trim)
    return weighted_mean(vectors, weights)


def vector_norm(vector: Weights) -> float:
    """Euclidean norm of a model-shaped vector, accumulated in float64."""
    return sum(float(np.sum(a.astype(np.float64) ** 2)) for a in vector) ** 0.5


def update_norms(w_t: Weights, uploads: Sequence[Weights], variant: str) -> list[float]:
    """Norm of each client's move: ||w_iK - w_t|| (model variant) or ||Delta_i|| (update)."""
    if variant != "model":
        return [vector_norm(up) for up in uploads]
    return [vector_norm([u.astype(np.float64) - w for u, w in zip(up, w_t, strict=True)])
            for up in uploads]
