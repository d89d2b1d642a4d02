"""Clustered FL (book section 6.2): one model per cluster; each client's cluster chosen by
the loss of the cluster models on its own data (IFCA, Ghosh et al. 2020; the default) or by
k-means of the clients' updates.

Server: ``num-clusters`` models (all w_0 at the start) and each client's cluster (all in
cluster 0 until the first clustering). A sampled client receives its cluster's model in place
of the global model (and in personalized evaluation). Under ``cluster-assign=loss`` it also
receives, from round 2 on, the other K - 1 cluster models and its cluster's index (K models
down in all instead of one); it computes the mean loss of each of the K models on its own
training data (no gradient, the same batches for each), picks the lowest (ties: the lowest
index), trains that model with the run's local SGD (FedAvg's client) and uploads its final
model with its choice (``cluster-choice``, an int in the reply's metrics; nothing else about
the K losses leaves the device). The server rejects a reply whose choice is missing, not an
int, or out of range (logged, never aggregated), puts the client in the cluster it chose and
moves each cluster's model by the weighted mean of the moves of the replies that chose it
(times ``server-lr``). Labels are stable: a cluster keeps its index. A client not sampled
keeps its last cluster.

Round 1 has nothing to choose between (every cluster model is w_0: every loss ties), so under
both rules the clients trained in round 1 are clustered by k-means (scipy's ``kmeans2``,
k-means++ start, seeded by the round) on their round-1 updates (upload minus the model they
received, count-sketched and scaled to norm 1: cosine geometry), which gives K different
models built from the clients' own data; under ``loss`` the clients choose from round 2 on.
Seeded perturbations of w_0 would be the other start: for a CNN they differ too little for
the losses to separate anything, and the cluster that happens to fit everyone best takes every
client. Under ``cluster-assign=kmeans`` the clients are re-clustered by k-means after round 1
and every ``cluster-every`` rounds; new clusters take the labels of the old clusters they
overlap most (an assignment problem), and a cluster that inherits none of its members takes
the model most of them come from. A client that has never trained stays in cluster 0 (under
``loss``: until it chooses). The assignment is written to the run directory
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
    ClientUpdate,
    LocalJob,
    LocalOutcome,
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
ASSIGN_RULES = ("loss", "kmeans")
OTHERS = "cluster-others"
"""Down arrays: the other cluster models, each parameter stacked, shape (M, *shape) with M =
K - 1 under ``loss`` from round 2 on and M = 0 otherwise (nothing to choose between)."""
CURRENT = "cluster-current"
"""Down array: [int64 (1,)], the index of the cluster whose model is the message's model."""
CHOICE = "cluster-choice"
"""Reply metric: the cluster the client chose and trained (an int in 0..K-1)."""


@dataclass(frozen=True)
class ClusteredParams(Params):
    num_clusters: int
    """K: the number of clusters and models."""
    cluster_every: int
    """Rounds between k-means re-clusterings (after round 1 and every this many), ``kmeans``."""
    cluster_assign: str
    """``loss``: each client picks the cluster model with the lowest loss on its own data
    (IFCA); ``kmeans``: k-means of the clients' updates."""

    def check(self) -> None:
        check_range("num-clusters", self.num_clusters, self.num_clusters >= 1,
                    "an integer >= 1 (1 = FedAvg)")
        check_range("cluster-every", self.cluster_every, self.cluster_every >= 1,
                    "an integer >= 1")
        check_range("cluster-assign", self.cluster_assign,
                    self.cluster_assign in ASSIGN_RULES, " | ".join(ASSIGN_RULES))


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
    """One model per cluster; each client's cluster by its own losses (``loss``) or by
    k-means of the clients' updates (``kmeans``)."""

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

    @property
    def by_loss(self) -> bool:
        return self.params.cluster_assign == "loss"

    def down_to(self, state: ClusteredState, partition_id: int, w_t: Weights) -> ClientDown:
        """The client's cluster model, its index and the other cluster models to choose
        from (under ``loss`` once round 1 has clustered; none otherwise)."""
        c = self.cluster_of(state, partition_id)
        choose = self.by_loss and len(state.assignment[0]) > 0  # after round 1
        others = [np.delete(m, c, axis=0) if choose else m[:0] for m in state.models]
        return ClientDown(self.model(state, c),
                          {OTHERS: others, CURRENT: [np.asarray([c], dtype=np.int64)]})

    def reply_problem(self, update: ClientUpdate, expected_steps: int | None) -> str | None:
        """The cluster choice must be an int naming a cluster (it picks the model the
        reply's move is taken from and the cluster it is added to)."""
        k = self.params.num_clusters
        if CHOICE not in update.metrics:
            return f"missing metric {CHOICE!r} (the cluster the client trained)"
        choice = update.metrics[CHOICE]
        if isinstance(choice, bool) or not isinstance(choice, int | np.integer) or not (
                0 <= int(choice) < k):
            return f"{CHOICE}={choice!r} is not a cluster; allowed: an integer in 0..{k - 1}"
        return None

    def update(self, state: ClusteredState, w_t: Weights,
               rnd: RoundInput) -> tuple[Weights, ClusteredState]:
        """Each reply's move from the model it trained (its cluster's, or under ``loss`` the
        one it chose) is added to its cluster's model; k-means when due: under ``kmeans``
        after the moves (a new cluster takes an old one's model), under ``loss`` in round 1
        before them, so each cluster's model starts from its own members' moves."""
        assert rnd.variant == "model"
        n, k = rnd.num_clients, self.params.num_clusters
        before = gr.grown_rows(state.assignment[0], n)
        assignment = before.copy()
        sketch = gr.grown_rows(state.sketch[0], n)
        models = [m.copy() for m in state.models]
        moves: list[tuple[int, Weights, float]] = []
        for u, weight in zip(rnd.updates, rnd.weights, strict=True):
            if self.by_loss:  # the client's choice (checked by reply_problem)
                assignment[u.partition_id] = int(u.metrics[CHOICE])
            c = int(assignment[u.partition_id])
            move = [a.astype(np.float64) - m[c].astype(np.float64)
                    for a, m in zip(u.upload, state.models, strict=True)]
            sketch[u.partition_id] = gr.sketch(move)
            moves.append((u.partition_id, move, weight))
        if k > 1 and self.by_loss and rnd.server_round == 1:  # every model is still w_0
            assignment, models = self.recluster(assignment, sketch, models, rnd.server_round)
        by_cluster: dict[int, list[tuple[Weights, float]]] = {}
        for pid, move, weight in moves:
            by_cluster.setdefault(int(assignment[pid]), []).append((move, weight))
        for c, mine in sorted(by_cluster.items()):
            total = sum(wt for _, wt in mine)
            for i, m in enumerate(models):
                mean = sum(wt * mv[i] for mv, wt in mine) / total
                m[c] = (m[c].astype(np.float64) + rnd.server_lr * mean).astype(m.dtype)
        if k > 1 and not self.by_loss and (
                rnd.server_round == 1 or rnd.server_round % self.params.cluster_every == 0):
            assignment, models = self.recluster(assignment, sketch, models, rnd.server_round)
        if not np.array_equal(assignment, before):
            self.report(assignment, rnd.server_round)
        counts = np.bincount(assignment, minlength=k).astype(np.float64)
        w_next = [np.tensordot(counts / counts.sum(), m.astype(np.float64), axes=1).astype(
            m.dtype) for m in models]
        return w_next, dataclasses.replace(state, models=models, assignment=[assignment],
                                           sketch=[sketch])

    def recluster(self, assignment: np.ndarray, sketch: np.ndarray, models: Weights,
                  server_round: int) -> tuple[np.ndarray, Weights]:
        """k-means of the trained clients' unit sketches; labels kept stable."""
        k = self.params.num_clusters
        known = np.flatnonzero(np.linalg.norm(sketch, axis=1) > 0)
        if len(known) < k:
            return assignment, models
        labels = kmeans(gr.unit_rows(sketch[known]), k, seed=server_round)
        renamed, source = relabel(assignment[known], labels, k)
        new = assignment.copy()
        new[known] = renamed
        return new, [m[source].copy() for m in models]

    def report(self, assignment: np.ndarray, server_round: int) -> None:
        """One line of ``clusters.jsonl``: the round and every client's cluster."""
        if self.results is None:
            return
        self.results.append_line(CLUSTERS_FILE, json.dumps(
            {"round": server_round, "assignment": [int(a) for a in assignment]}))


def candidates(job: LocalJob) -> list[Weights]:
    """The cluster models a client may choose from, by index: the message's model at its
    index (``CURRENT``) among the others (``OTHERS``)."""
    current = int(np.asarray(job.down[CURRENT][0]).reshape(-1)[0])
    others = job.down[OTHERS]
    count = int(others[0].shape[0]) if others else 0
    models: list[Weights] = [[o[j] for o in others] for j in range(count)]
    models.insert(current, list(job.w_t))
    return models


def choose(losses: list[float]) -> int:
    """The lowest loss (NaN counts as +inf); ties: the lowest index."""
    values = np.asarray(losses, dtype=np.float64)
    return int(np.argmin(np.where(np.isnan(values), np.inf, values)))


class ClusteredClient(ClientRule[ClusteredParams]):
    """Picks the cluster model with the lowest mean loss on its own training data (when sent
    more than one), trains it with FedAvg's local SGD, reports the choice."""

    down_keys = (OTHERS, CURRENT)

    def train(self, job: LocalJob) -> LocalOutcome:
        models = candidates(job)
        if len(models) == 1:  # only its cluster's model (k-means, or round 1)
            trained = job.sgd(job.w_t)
            choice = int(np.asarray(job.down[CURRENT][0]).reshape(-1)[0])
            return LocalOutcome(trained, dict(job.state), {}, {CHOICE: choice})
        if job.losses is None:
            raise ValueError("clustered FL with cluster-assign=loss needs the client's "
                             "training losses (LocalJob.losses); this client shell gives none")
        choice = choose(job.losses(models))
        return LocalOutcome(job.sgd(models[choice]), dict(job.state), {}, {CHOICE: choice})


SPEC = MethodSpec(name="clustered", label="Clustered FL", params=ClusteredParams,
                  server=ClusteredServer, client=ClusteredClient, ri_aggregation="model")
