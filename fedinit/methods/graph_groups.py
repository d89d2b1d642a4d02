"""The groups of FedRelax's graph that ``relax-train=groups`` trains one model each for: the
connected components of the graph, for the loss graph of its mutual choices.

A client's lowest-loss choice links it to clients whose models fit its data; the union of
those choices (the graph in use) has 15-20% cross-regime edges in the 6b runs, enough to join
every regime into one component. The mutual k-nearest-neighbour graph (i chose j and j chose
i) keeps an edge only when both ends agree, and its connected components are the clusters
(Brito, Chavez, Quiroz and Yukich 1997, "Connectivity of the mutual k-nearest-neighbor graph
in clustering and outlier detection"; Maier, Hein and von Luxburg 2009, "Optimal construction
of k-nearest-neighbor graphs for identifying noisy clusters"). A given (``file:``) or knn
graph is used as it stands. A client in no mutual pair joins the group most of its own
choices belong to (the k-nearest-neighbour rule, Cover and Hart 1967, with the groups of two
or more as the classes; ties: the smallest group id): its data chose them, so it trains with
them instead of alone until the choices become mutual. The clients left alone after that
(under the loss graph: not measured yet, or chosen by no group) form one more group, the
pool, which goes on training the warm-up's shared model by FedAvg: clustered FL's start in
one cluster from which groups split off once detected (Sattler, Mueller and Samek 2020,
"Clustered federated learning"), rather than each training alone on its own few examples.

Under ``relax-groups-by=loss`` these groups only seed the membership (``numbered``, when the
warm-up ends); after that a sampled client joins the group whose model has the lowest loss on
its own data (``joined``: IFCA's rule, Ghosh, Chung, Yin and Ramchandran 2020, "An efficient
framework for clustered federated learning", with clustered FL's margin for a member).
Pure numpy (``joined`` reuses ``fedinit.methods.clustered.choose``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from fedinit.methods import graph_loss as gl
from fedinit.methods.clustered import choose

POOL = -1
"""The group label of the clients in no other group (``pooled``)."""


def mutual_graph(chosen: np.ndarray) -> list[np.ndarray]:
    """Edge {i, j} (A_ij = 1) when i chose j and j chose i (``fedinit.methods.graph``'s
    arrays; ``chosen`` is the loss graph's (N, k) choice, ``NONE`` for an empty slot)."""
    picked = {(i, int(j)) for i, row in enumerate(chosen) for j in row
              if j != gl.NONE and j != i}
    keys = sorted((i, j) for i, j in picked if i < j and (j, i) in picked)
    return [np.asarray(keys, dtype=np.int64).reshape(-1, 2), np.ones(len(keys))]


def components(graph: list[np.ndarray], n: int) -> np.ndarray:
    """[int64 (n,)]: each client's group, the smallest client id of its connected component
    (a client without an edge is a group of its own)."""
    root = np.arange(n, dtype=np.int64)

    def find(i: int) -> int:
        while root[i] != i:
            root[i] = root[root[i]]  # path halving
            i = int(root[i])
        return i

    for i, j in graph[0]:
        if i >= n or j >= n:
            continue
        a, b = find(int(i)), find(int(j))
        if a != b:
            root[max(a, b)] = min(a, b)
    return np.asarray([find(i) for i in range(n)], dtype=np.int64)


def members(labels: np.ndarray, cid: int) -> np.ndarray:
    """The clients (ascending) in client ``cid``'s group; ``cid`` alone when it is beyond
    ``labels`` (a client that joined after the groups were formed)."""
    if cid >= len(labels):
        return np.asarray([cid], dtype=np.int64)
    return np.flatnonzero(labels == labels[cid]).astype(np.int64)


def attached(labels: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """``labels`` with each client of a group of one that chose a member of a larger group
    moved to the larger group most of its choices are in (ties: the smallest group id); the
    larger groups are those of ``labels`` (no chains through attached clients)."""
    ids, counts = np.unique(labels, return_counts=True)
    size = dict(zip(ids.tolist(), counts.tolist(), strict=True))
    out = labels.copy()
    for i in range(min(len(labels), len(chosen))):
        if size[int(labels[i])] > 1:
            continue
        votes = [int(labels[j]) for j in chosen[i] if j != gl.NONE and j < len(labels)
                 and size[int(labels[j])] > 1]
        if votes:
            group, count = np.unique(votes, return_counts=True)
            out[i] = int(group[np.argmax(count)])  # argmax: the first (smallest) of a tie
    return out


def pooled(labels: np.ndarray) -> np.ndarray:
    """``labels`` with every group of one relabelled ``POOL`` (one group of the rest)."""
    ids, counts = np.unique(labels, return_counts=True)
    alone = ids[counts == 1]
    return np.where(np.isin(labels, alone), POOL, labels).astype(np.int64)


def numbered(labels: np.ndarray) -> np.ndarray:
    """``labels`` (``pooled``'s or ``components``') renumbered 0, 1, 2, ...: the pool 0 (the
    number is kept when there is none), the other groups 1, 2, ... in the order of their labels
    (their smallest client). A client beyond the labels (one that joins later) is in group 0."""
    others = sorted(set(labels.tolist()) - {POOL})
    index = {g: i + 1 for i, g in enumerate(others)} | {POOL: 0}
    return np.asarray([index[int(g)] for g in labels], dtype=np.int64)


def joined(metrics: Mapping[str, Any], ids: np.ndarray, current: int, margin: float) -> int:
    """The position in ``ids`` (the groups whose models a client was sent, ascending) of the
    group it joins: the lowest loss it reported (``fedrelax-loss-<group>``, the loss graph's
    channel; ties: the first), unless that loss is not below (1 - ``margin``) x the loss of
    its own group's model (position ``current``), where it stays (IFCA, Ghosh et al. 2020,
    with clustered FL's member margin: ``fedinit.methods.clustered.choose``); ``current`` < 0:
    a newcomer (no upload yet), the lowest loss, no margin."""
    losses = [float(metrics[gl.loss_key(int(g))]) for g in ids]
    return choose(losses, current if current >= 0 else None, margin)


def placed(labels: np.ndarray, nearest: np.ndarray) -> np.ndarray:
    """``labels`` (``pooled``'s) with each pooled client whose candidate model fit some
    client's data best (``nearest``'s row: [1 + that client, its loss]; 0: none) moved to
    that client's group, unless that client is pooled too (no chains): the loss graph's
    evidence for a client that chose no group and that no group chose."""
    out = labels.copy()
    for i in np.flatnonzero(labels == POOL):
        if i < len(nearest) and nearest[i, 0] > 0:
            j = int(nearest[i, 0]) - 1
            if j < len(labels) and labels[j] != POOL:
                out[i] = labels[j]
    return out
