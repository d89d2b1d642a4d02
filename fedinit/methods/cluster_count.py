"""How many clusters the warm-up's moves hold (clustered FL's ``num-clusters=0``): for each k
in 2..``k_cap(n)`` the k-means clustering of the clients' unit sketched moves (clustered.py's
``kmeans``), scored by its mean silhouette (Rousseeuw 1987) on cosine distance; the k with the
largest score wins, or k = 1 when no score reaches ``SILHOUETTE_MIN``. k-means splits any
cloud into k groups; the silhouette says whether the groups are real (each point nearer its
own group than the next one), without a scale to tune. scikit-learn's ``silhouette_score`` is
not a dependency here; scipy gives the distances and the definition is four lines."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedinit.methods.kmeans import kmeans

K_CAP = 8
"""The largest k tried (and never more than half the clients: two clients a cluster on
average, or a silhouette is mostly singletons')."""
SILHOUETTE_MIN = 0.2
"""Below this best silhouette the moves are one cloud: K = 1 (FedAvg). On 15 synthetic unit
moves in 256 dimensions, 3 groups with cosines about 0.4 inside and 0 across score 0.36-0.41
at k = 3; k-means splits of one cloud score 0.02-0.10 (3 seeds each)."""
MIN_CLIENTS = 4
"""The clients a choice needs (k = 2 with two clients each)."""


def k_cap(num_points: int) -> int:
    """The largest k tried for ``num_points`` moves: min(``K_CAP``, num_points // 2)."""
    return min(K_CAP, num_points // 2)


def silhouette(points: np.ndarray, labels: np.ndarray) -> float:
    """The mean silhouette of ``labels`` on the cosine distance of ``points``' rows; a point
    alone in its cluster scores 0; -1 when fewer than two clusters are used."""
    from scipy.spatial.distance import pdist, squareform

    used = np.unique(labels)
    if len(used) < 2:
        return -1.0
    dist = squareform(pdist(points.astype(np.float64), metric="cosine"))
    mean_to = np.stack([dist[:, labels == c].mean(axis=1) for c in used], axis=1)
    sizes = np.asarray([(labels == c).sum() for c in used])
    own = np.searchsorted(used, labels)
    rows = np.arange(len(labels))
    a = mean_to[rows, own] * sizes[own] / np.maximum(sizes[own] - 1, 1)  # without itself
    mean_to[rows, own] = np.inf
    b = mean_to.min(axis=1)
    s = np.where(sizes[own] > 1, (b - a) / np.maximum(np.maximum(a, b), 1e-12), 0.0)
    return float(s.mean())


@dataclass(frozen=True)
class CountChoice:
    """The chosen number of clusters, its labels (all 0 for k = 1), each k's silhouette and
    each k's labels (recorded so that another rule for K can be judged offline, purity too)."""

    k: int
    labels: np.ndarray
    scores: dict[int, float]
    tried: dict[int, np.ndarray] = field(default_factory=dict)


def choose_k(points: np.ndarray, seed: int, restarts: int) -> CountChoice:
    """The k of the best silhouette over k = 2..``k_cap`` (ties: the smaller k), or 1 when
    none reaches ``SILHOUETTE_MIN`` or fewer than ``MIN_CLIENTS`` points are given."""
    best = CountChoice(1, np.zeros(len(points), dtype=np.int64), {})
    scores: dict[int, float] = {}
    tried: dict[int, np.ndarray] = {}
    top = SILHOUETTE_MIN
    for k in range(2, k_cap(len(points)) + 1):
        labels = kmeans(points, k, seed=seed, restarts=restarts)
        scores[k], tried[k] = silhouette(points, labels), labels
        if scores[k] >= top and (best.k == 1 or scores[k] > top):
            best, top = CountChoice(k, labels, {}), scores[k]
    used, labels = np.unique(best.labels, return_inverse=True)  # an emptied k-means cluster
    return CountChoice(len(used), labels.astype(np.int64), scores, tried)
