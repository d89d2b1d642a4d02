"""How the round's uploads are combined: weighted mean, or a robust statistic.

Median and trimmed mean work coordinate by coordinate and ignore the example weights (a
client cannot buy influence by claiming more examples). They bound what a few bad but
well-formed replies can do that the reply checks in ``server_app.strategy.MethodStrategy``
cannot catch.
The trimmed mean is Flower's (``fedtrimmedavg.trim_mean``: floor(trim * n) values cut at each
end, as scipy's), applied to the model-shaped vectors in float64.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean

from methods.ri import weighted_mean
from methods.weights import Weights


def coordinate_median(vectors: Sequence[Weights]) -> Weights:
    """Coordinate-wise median of model-shaped vectors."""
    return [np.median(np.stack([v[i] for v in vectors]), axis=0).astype(np.float32)
            for i in range(len(vectors[0]))]


def trimmed_mean(vectors: Sequence[Weights], trim: float) -> Weights:
    """Coordinate-wise mean after dropping floor(trim * n) values at each end."""
    return [np.asarray(trim_mean(np.stack([v[i].astype(np.float64) for v in vectors]), trim))
            .astype(np.float32) for i in range(len(vectors[0]))]


def combine(vectors: Sequence[Weights], weights: Sequence[float], kind: str,
            trim: float) -> Weights:
    """The configured combination (``aggregation`` key) of the round's uploads."""
    if kind == "median":
        return coordinate_median(vectors)
    if kind == "trimmed-mean":
        return trimmed_mean(vectors, trim)
    return weighted_mean(vectors, weights)
