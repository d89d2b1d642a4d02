"""Clustered FL (book section 6.2): clients grouped by the similarity of their updates, one
model per cluster.

Server: ``num-clusters`` models (all w_0 at the start) and each client's cluster (all in
cluster 0 until the first clustering). A sampled client receives its cluster's model in place
of the global model (and in personalized evaluation), trains it with the run's local SGD
(FedAvg's client) and uploads its final model. Each cluster's model moves by the weighted mean
of its members' moves this round (times ``server-lr``). After round 1 and every
``cluster-every`` rounds the clients that have trained are re-clustered by k-means (scipy's
``kmeans2``, k-means++ start, seeded by the round) on their latest updates (upload minus the
model they received, count-sketched and scaled to norm 1: cosine geometry); new clusters take
the labels of the old clusters they overlap most (an assignment problem), and a cluster that
inherits none of its members takes the model most of them come from. A client that has never
trained stays in cluster 0. The assignment is written to the run directory
(``clusters.jsonl``, one line per change). The global model returned each round is the
member-weighted mean of the cluster models (the central accuracy curve).

RI and DP are refused for the same reasons as FedRelax's: a client trains from its cluster's
model, not a global one, and the server needs each client's exact update to cluster it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np

from methods import graph as gr
from methods.method import (
    ClientDown,
    ClientRule,
    MethodSpec,
    ModelFiles,
    Params,
    ReportFiles,
    RoundInput,
    ServerRule,
    ServerState,
    check_range,
)
from methods.weights import Weights

CLUSTERS_FILE = "clusters.jsonl"
KMEANS_ITER = 20


@dataclass(frozen=True)
class ClusteredParams(Params):
    num_clusters: int
    """K: the number of clusters and models."""
    cluster_every: int
    """Rounds between re-clusterings (after round 1 and every this many)."""

    def check(self) -> None:
        check_range("num-clusters", self.num_clusters, self.num_clusters >= 1,
                    "an integer >= 1 (1 = FedAvg)")
        check_range("cluster-every", self.cluster_every, self.cluster_every >= 1,
                    "an integer >= 1")


@dataclass(frozen=True)
class ClusteredState(ServerState):
    models: Weights
    """The cluster models, each parameter stacked: arrays of shape (K, *shape)."""
    assignment: Weights
    """[int64 (N,)]: each client's cluster."""
    sketch: Weights
    """[float32 (N, SKETCH_DIM)]: each client's latest update, sketched (zero: none yet)."""



def kmeans(points: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Cluster labels of ``points`` by scipy's k-means (k-means++ start, seeded)."""
    from scipy.cluster.vq import kmeans2

    _, labels = kmeans2(points.astype(np.float64), k, iter=KMEANS_ITER, minit="++",
                        seed=np.random.default_rng(seed), missing="warn")
    return np.asarray(labels, dtype=np.int64)


def relabel(old: np.ndarray, new: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(``new`` renamed so each new cluster takes the old label it overlaps most, one to one;
    for each cluster the old cluster its model comes from)."""
    from scipy.optimize import linear_sum_assignment

    overlap = np.zeros((k, k), dtype=np.int64)  # [new, old]
    np.add.at(overlap, (new, old), 1)
    rows, cols = linear_sum_assignment(-overlap)
    rename = np.empty(k, dtype=np.int64)
    rename[rows] = cols
    renamed = rename[new]
    source = np.arange(k)
    for r, c in zip(rows, cols, strict=True):
        if overlap[r, c] == 0 and overlap[r].any():  # inherits none of its members' model
            source[c] = int(np.argmax(overlap[r]))
    return renamed, source


class ClusteredServer(ServerRule[ClusteredParams, ClusteredState]):
    """One model per cluster; k-means of the clients' updates."""

    state_type = ClusteredState
    per_client_refusal = ("each client trains from its cluster's model, not a global one, and "
                          "the server clusters the clients' exact updates")
    robust_refusal = "the clusters are formed from each client's exact update"

    def __init__(self, params: ClusteredParams) -> None:
        super().__init__(params)
        self.results: ReportFiles | None = None

    def bind(self, models: ModelFiles, results: ReportFiles | None) -> None:
        self.results = results

    def init(self, w0: Weights) -> ClusteredState:
        k = self.params.num_clusters
        return ClusteredState(
            models=[np.repeat(a[None], k, axis=0) for a in w0],
            assignment=[np.zeros(0, dtype=np.int64)],
            sketch=[np.zeros((0, gr.SKETCH_DIM), dtype=np.float32)])

    @staticmethod
    def cluster_of(state: ClusteredState, pid: int) -> int:
        a = state.assignment[0]
        return int(a[pid]) if pid < len(a) else 0

    @staticmethod
    def model(state: ClusteredState, cluster: int) -> Weights:
        return [m[cluster].copy() for m in state.models]

    def down_to(self, state: ClusteredState, partition_id: int, w_t: Weights) -> ClientDown:
        return ClientDown(self.model(state, self.cluster_of(state, partition_id)))

    def update(self, state: ClusteredState, w_t: Weights,
               rnd: RoundInput) -> tuple[Weights, ClusteredState]:
        assert rnd.variant == "model"
        n, k = rnd.num_clients, self.params.num_clusters
        assignment = gr.grown_rows(state.assignment[0], n)
        sketch = gr.grown_rows(state.sketch[0], n)
        models = [m.copy() for m in state.models]
        by_cluster: dict[int, list[tuple[Weights, float]]] = {}
        for u, weight in zip(rnd.updates, rnd.weights, strict=True):
            c = int(assignment[u.partition_id])
            move = [a.astype(np.float64) - m[c].astype(np.float64)
                    for a, m in zip(u.upload, state.models, strict=True)]
            sketch[u.partition_id] = gr.sketch(move)
            by_cluster.setdefault(c, []).append((move, weight))
        for c, moves in sorted(by_cluster.items()):
            total = sum(wt for _, wt in moves)
            for i, m in enumerate(models):
                mean = sum(wt * mv[i] for mv, wt in moves) / total
                m[c] = (m[c].astype(np.float64) + rnd.server_lr * mean).astype(m.dtype)
        if k > 1 and (rnd.server_round == 1 or rnd.server_round % self.params.cluster_every == 0):
            assignment, models = self.recluster(assignment, sketch, models, rnd.server_round)
        counts = np.bincount(assignment, minlength=k).astype(np.float64)
        w_next = [np.tensordot(counts / counts.sum(), m.astype(np.float64), axes=1).astype(
            m.dtype) for m in models]
        return w_next, dataclasses.replace(state, models=models, assignment=[assignment],
                                           sketch=[sketch])

    def recluster(self, assignment: np.ndarray, sketch: np.ndarray, models: Weights,
                  server_round: int) -> tuple[np.ndarray, Weights]:
        """k-means of the trained clients' unit sketches; labels kept stable; logged."""
        k = self.params.num_clusters
        known = np.flatnonzero(np.linalg.norm(sketch, axis=1) > 0)
        if len(known) < k:
            return assignment, models
        labels = kmeans(gr.unit_rows(sketch[known]), k, seed=server_round)
        renamed, source = relabel(assignment[known], labels, k)
        new = assignment.copy()
        new[known] = renamed
        models = [m[source].copy() for m in models]
        if not np.array_equal(new, assignment):
            self.report(new, server_round)
        return new, models

    def report(self, assignment: np.ndarray, server_round: int) -> None:
        """One line of ``clusters.jsonl``: the round and every client's cluster."""
        if self.results is None:
            return
        self.results.append_line(CLUSTERS_FILE, json.dumps(
            {"round": server_round, "assignment": [int(a) for a in assignment]}))


class ClusteredClient(ClientRule[ClusteredParams]):
    """FedAvg's client: local SGD from the received (cluster) model."""


SPEC = MethodSpec(name="clustered", label="Clustered FL", params=ClusteredParams,
                  server=ClusteredServer, client=ClusteredClient, ri_aggregation="model")
