"""How the round's uploads are combined: weighted mean, a coordinate-wise robust statistic, or
a Byzantine-resilient selection of whole replies (Krum, Multi-Krum, Bulyan).

Two steps. ``select`` picks the replies that take part (all of them, except under Krum,
Multi-Krum and Bulyan); it looks at every uploaded vector of a reply jointly (its model move
and its extra uploads, e.g. SCAFFOLD's Delta_c_i, concatenated), so a reply is in or out as
a whole. ``combine`` then folds one vector per selected reply into one: the SAME rule for the
model upload and for every extra upload (``RoundInput.combine``).

- ``median``, ``trimmed-mean``: coordinate by coordinate, ignoring the example weights (a
  client cannot buy influence by claiming more examples). The trimmed mean is Flower's
  (``fedtrimmedavg.trim_mean``: floor(trim * n) values cut at each end, as scipy's).
- ``krum``, ``multi-krum``: Flower's ``select_multikrum`` (Blanchard et al. 2017): score of a
  reply = sum of the squared L2 distances of its joint vector to its n - f - 2 nearest
  others; Krum keeps the lowest score (combine: that vector), Multi-Krum the n - f lowest
  (combine: their mean with the round's weights, as Flower's MultiKrum).
- ``bulyan``: Flower 1.39's Bulyan (El Mhamdi et al. 2018): theta = n - 2f replies selected
  by Multi-Krum in one pass (Flower's choice; the paper applies Krum theta times), then per
  coordinate the mean of the beta = theta - 2f values closest to the coordinate-wise median
  (``bulyan.aggregate_n_closest_weights``), unweighted.

n is the number of usable replies and f ``byzantine-f``; Krum and Multi-Krum need n > 2f + 2,
Bulyan n >= 4f + 3 (``robust_choices.min_replies``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from flwr.app import ArrayRecord, RecordDict
from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum

from methods.ri import weighted_mean
from methods.robust_choices import SELECTIONS, min_replies
from methods.weights import Weights


def coordinate_median(vectors: Sequence[Weights]) -> Weights:
    """Coordinate-wise median of model-shaped vectors."""
    return [np.median(np.stack([v[i] for v in vectors]), axis=0).astype(np.float32)
            for i in range(len(vectors[0]))]


def trimmed_mean(vectors: Sequence[Weights], trim: float) -> Weights:
    """Coordinate-wise mean after dropping floor(trim * n) values at each end."""
    return [np.asarray(trim_mean(np.stack([v[i].astype(np.float64) for v in vectors]), trim))
            .astype(np.float32) for i in range(len(vectors[0]))]


def select(joint: Sequence[Weights], kind: str, f: int) -> list[int] | None:
    """Indices (ascending) of the replies that take part, given each reply's joint vector
    (all its uploads, as the server sees them); None when there are too few replies for
    ``kind`` with ``f`` attackers."""
    n = len(joint)
    if kind not in SELECTIONS:
        return list(range(n))
    if n < min_replies(kind, f):
        return None
    keep = {"krum": 1, "multi-krum": n - f, "bulyan": n - 2 * f}[kind]
    contents = [RecordDict({"joint": ArrayRecord([np.asarray(a, np.float64) for a in v])})
                for v in joint]
    chosen = select_multikrum(contents, num_malicious_nodes=f, num_nodes_to_select=keep)
    return sorted(next(i for i, c in enumerate(contents) if c is s) for s in chosen)


def combine(vectors: Sequence[Weights], weights: Sequence[float], kind: str,
            trim: float, f: int = 0) -> Weights:
    """The configured combination (``aggregation`` key) of one vector per selected reply."""
    if kind == "median":
        return coordinate_median(vectors)
    if kind == "trimmed-mean":
        return trimmed_mean(vectors, trim)
    if kind == "krum":
        if len(vectors) != 1:
            raise ValueError(f"krum combines the one selected reply, got {len(vectors)}")
        return [np.asarray(a, np.float32) for a in vectors[0]]
    if kind == "bulyan":
        beta = len(vectors) - 2 * f
        ref = [np.median(np.stack([v[i] for v in vectors]), axis=0)
               for i in range(len(vectors[0]))]
        return [np.asarray(a, np.float32) for a in aggregate_n_closest_weights(
            ref, [list(v) for v in vectors], beta)]
    return weighted_mean(vectors, weights)  # mean, and multi-krum over the selected
