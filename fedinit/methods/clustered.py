"""Clustered FL (book section 6.2): one model per cluster; each client's cluster chosen by
the loss of the cluster models on its own data (IFCA, Ghosh et al. 2020; the default) or by
k-means of the clients' updates.

Server: ``num-clusters`` models (all w_0 at the start) and each client's cluster (all in
cluster 0 until the first clustering). A sampled client receives its cluster's model in place
of the global model (and in personalized evaluation). Under ``cluster-assign=loss`` it also
receives, once the warm-up below has clustered, the other K - 1 cluster models and its
cluster's index (K models down in all instead of one); it computes the mean loss of each of the
K models on its own training data (no gradient, the same batches for each), picks the lowest
(ties: the lowest index), trains that model with the run's local SGD (FedAvg's client) and
uploads its final model with its choice (``cluster-choice``, an int in the reply's metrics;
nothing else about the K losses leaves the device). The server rejects a reply whose choice is
missing, not an int, or out of range (logged, never aggregated), puts the client in the cluster
it chose and moves each cluster's model by the weighted mean of the moves of the replies that
chose it (times ``server-lr``). Labels are stable: a cluster keeps its index. A client not
sampled keeps its last cluster.

Under ``loss`` the first clustering waits for ``cluster-warmup`` rounds (default 3): every
model is still w_0 (every loss would tie), so the sampled clients train w_0, the server keeps
each one's move from w_0 (its latest; the models do not move), and after the warm-up's last
round (and once at least K clients have trained) clusters every client trained so far by
k-means (scipy's ``kmeans2``, k-means++ start, the best of ``KMEANS_RESTARTS`` seeded starts)
of those moves (count-sketched and scaled to norm 1: cosine geometry); each cluster's model is
then w_0 plus its members' weighted mean move. One round's 6 clients for 4 clusters gave each
model one or two clients' move to start from, and the cluster trained by most clients then
took the others' (docs/reproduction.md 6b); the warm-up's 14-16 clients give each cluster a
regime. After it, a member (a client clustered or trained since) leaves its cluster only for
a model whose loss is below (1 - ``cluster-margin``) x its own cluster model's; a newcomer
under ``cluster-newcomer=probe`` is sent w_0 and the warm-up's unit centroids as well, trains
w_0 once (the warm-up's pass), and takes the cluster whose centroid its own sketched move is
nearest to by cosine, then trains that cluster's model (one extra local pass, once per
client). Rotated regimes that look alike (0 and 180 degrees) made the lowest loss pick the
better-trained model of the wrong regime; the probe asks the question the warm-up's k-means
answered. ``cluster-split`` > -1 adds CFL's split (Sattler et al.): a cluster with two or more
replies in a round, while some cluster holds no trained client, bipartitions its replies'
moves (complete linkage on cosine distance) and, where every cross cosine is below the
threshold, the group without the round's lowest client id moves to the lowest empty cluster,
which starts from the split cluster's model (each split is logged in ``clusters.jsonl``).
Under ``cluster-assign=kmeans`` the clients are re-clustered by k-means after round 1
and every ``cluster-every`` rounds; new clusters take the labels of the old clusters they
overlap most (an assignment problem), and a cluster that inherits none of its members takes
the model most of them come from. A client that has never trained stays in cluster 0 (under
``loss``: until it chooses) for training, but has no cluster: personalized evaluation scores
it on the member-weighted mean of the cluster models (what a newcomer holds before it
chooses; ``evaluated_model``). ``num-clusters=0`` (``loss`` only) chooses K at the warm-up's
clustering: the k in 2..min(8, clients / 2) whose k-means of the moves has the best mean
silhouette, or 1 when none reaches 0.2 (``fedinit.methods.cluster_count``); until then the state
holds one model. Warm-up, margin, probe and split are ``loss``'s only. The assignment is written to
the run directory (``clusters.jsonl``, one line per change; the warm-up's line under
``num-clusters=0`` also names K and each k's silhouette). The global model returned each round
is the member-weighted mean of the cluster models, each weighted by the trained clients it
holds (the central accuracy curve).

RI and DP are refused for the same reasons as FedRelax's: a client trains from its cluster's
model, not a global one, and the server needs each client's exact update to cluster it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import numpy as np

from fedinit.methods import cluster_count as cc
from fedinit.methods import graph as gr
from fedinit.methods.kmeans import kmeans
from fedinit.methods.method import (
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
from fedinit.methods.weights import Weights

CLUSTERS_FILE = "clusters.jsonl"
KMEANS_RESTARTS = 10
"""k-means runs (seeds) per clustering; the one with the least within-cluster sum of squares
and no empty cluster wins (one k-means++ start merges two regimes now and then)."""
ASSIGN_RULES = ("loss", "kmeans")
NEWCOMER_RULES = ("loss", "probe")
SERVE_RULES = ("assigned", "lowest-loss")
"""``cluster-serve``'s values (``ClusteredServer.evaluated_model``, ``evaluation_choices``)."""
OTHERS = "cluster-others"
"""Down arrays: the other cluster models, each parameter stacked, shape (M, *shape) with M =
K - 1 under ``loss`` after the warm-up and M = 0 otherwise (nothing to choose between)."""
CURRENT = "cluster-current"
"""Down array: [int64 (1,)], the index of the cluster whose model is the message's model."""
MEMBER = "cluster-member"
"""Down array: [int64 (1,)], 1 when the client is a member of that cluster (it has trained
since the first clustering or was clustered by it), 0 for a newcomer (no margin to keep)."""
ORIGIN = "cluster-origin"
"""Down arrays: w_0, each parameter stacked (M, *shape): M = 1 for a newcomer under
``cluster-newcomer=probe`` after the warm-up, 0 otherwise."""
CENTROIDS = "cluster-centroids"
"""Down array: [float32 (M, SKETCH_DIM)], the warm-up clusters' unit mean sketched moves from
w_0 (M = K with ``ORIGIN``'s w_0, 0 otherwise)."""
CHOICE = "cluster-choice"
"""Reply metric: the cluster the client chose and trained (an int in 0..K-1)."""


@dataclass(frozen=True)
class ClusteredParams(Params):
    num_clusters: int
    """K: the number of clusters and models; 0: chosen at the end of ``loss``'s warm-up
    (``fedinit.methods.cluster_count``)."""
    cluster_every: int
    """Rounds between k-means re-clusterings (after round 1 and every this many), ``kmeans``."""
    cluster_assign: str
    """``loss``: each client picks the cluster model with the lowest loss on its own data
    (IFCA); ``kmeans``: k-means of the clients' updates."""
    cluster_warmup: int
    """``loss``: the rounds before the first clustering, which clusters every client trained
    in them by k-means of its update from w_0 (1: round 1's clients alone)."""
    cluster_margin: float
    """``loss``: a member leaves its cluster only for a model whose loss is below (1 - this)
    x its own cluster model's loss (0: the lowest loss wins)."""
    cluster_newcomer: str
    """``loss``: a newcomer picks the lowest loss; ``probe``: it trains w_0 once and picks
    the warm-up cluster whose mean move its own move is closest to (cosine)."""
    cluster_split: float
    """``loss``: a cluster whose round replies bipartition with every cross-pair cosine below
    this splits into an empty cluster (CFL); -1: never."""
    cluster_serve: str
    """What personalized evaluation scores a client on: ``assigned`` (its cluster's model; the
    member-weighted mean before it has one) or ``lowest-loss`` (every cluster model that has
    members is sent and the client is scored on the one with the lowest loss on its own
    training data: IFCA's inference rule, also for a client that has never trained)."""

    def check(self) -> None:
        check_range("num-clusters", self.num_clusters, self.num_clusters >= 0,
                    "an integer >= 1 (1 = FedAvg), or 0 (chosen by the warm-up)")
        check_range("cluster-every", self.cluster_every, self.cluster_every >= 1,
                    "an integer >= 1")
        check_range("cluster-assign", self.cluster_assign,
                    self.cluster_assign in ASSIGN_RULES, " | ".join(ASSIGN_RULES))
        check_range("cluster-warmup", self.cluster_warmup, self.cluster_warmup >= 1,
                    "an integer >= 1")
        check_range("cluster-margin", self.cluster_margin, 0.0 <= self.cluster_margin < 1.0,
                    "a fraction in [0, 1)")
        check_range("cluster-newcomer", self.cluster_newcomer,
                    self.cluster_newcomer in NEWCOMER_RULES, " | ".join(NEWCOMER_RULES))
        check_range("cluster-split", self.cluster_split, -1.0 <= self.cluster_split <= 1.0,
                    "a cosine in [-1, 1] (-1: never split)")
        check_range("cluster-serve", self.cluster_serve, self.cluster_serve in SERVE_RULES,
                    " | ".join(SERVE_RULES))
        if self.num_clusters == 0:
            check_range("cluster-assign", self.cluster_assign, self.cluster_assign == "loss",
                        "loss with num-clusters=0 (K is chosen at the end of its warm-up)")


@dataclass(frozen=True)
class ClusteredState(ServerState):
    models: Weights
    """The cluster models, each parameter stacked: arrays of shape (K, *shape) (under
    ``num-clusters=0`` one model until the warm-up chooses K)."""
    assignment: Weights
    """[int64 (N,)]: each client's cluster."""
    sketch: Weights
    """[float32 (N, SKETCH_DIM)]: each client's latest update, sketched (zero: none yet)."""
    clustered: Weights
    """[int64 (1,)]: the round of the first clustering (0: not yet; ``loss`` warms up)."""
    pending: Weights
    """The warm-up's moves from w_0, each parameter stacked (N, *shape): a client's latest
    (rows of clients not trained yet are zero); no rows once clustered."""
    pending_weight: Weights
    """[float64 (N,)]: each pending move's weight (0: none)."""
    origin: Weights
    """w_0 (newcomers' probes start from it)."""
    centroids: Weights
    """[float32 (K, SKETCH_DIM)]: each warm-up cluster's unit mean unit sketch (zero rows
    until the warm-up clusters)."""


def tried_assignment(assignment: np.ndarray, known: np.ndarray, labels: np.ndarray) -> list[int]:
    """Every client's cluster had ``labels`` (one k's k-means of the ``known`` clients) won."""
    full = assignment.copy()
    full[known] = labels
    return [int(a) for a in full]


def bipartition(moves: np.ndarray) -> tuple[np.ndarray, float]:
    """CFL's split of a cluster's round replies (rows: flattened moves from the same model):
    two groups by complete linkage on cosine distance, and the largest cosine between the
    groups (low: the two groups' updates point apart). Returns (group of each row, 0 or 1;
    that cosine)."""
    from scipy.cluster.hierarchy import fcluster, linkage
    from scipy.spatial.distance import squareform

    unit = gr.unit_rows(moves)
    cos = np.clip(unit @ unit.T, -1.0, 1.0)
    dist = squareform(1.0 - cos, checks=False)
    groups = fcluster(linkage(dist, method="complete"), 2, criterion="maxclust") - 1
    groups = np.asarray(groups, dtype=np.int64)
    if groups[0] == 1:
        groups = 1 - groups  # row 0's group is group 0
    cross = cos[np.ix_(groups == 0, groups == 1)]
    return groups, float(cross.max()) if cross.size else 1.0


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
        self.k = params.num_clusters or 1
        """The number of cluster models in the state last seen (``reply_problem``'s range)."""

    def bind(self, models: ModelFiles, results: ReportFiles | None) -> None:
        self.results = results

    @property
    def auto(self) -> bool:
        """K chosen by the warm-up (``num-clusters=0``)."""
        return self.params.num_clusters == 0

    def init(self, w0: Weights) -> ClusteredState:
        k = self.params.num_clusters or 1
        self.k = k
        return ClusteredState(
            models=[np.repeat(a[None], k, axis=0) for a in w0],
            assignment=[np.zeros(0, dtype=np.int64)],
            sketch=[np.zeros((0, gr.SKETCH_DIM), dtype=np.float32)],
            clustered=[np.zeros(1, dtype=np.int64)],
            pending=[np.zeros((0, *a.shape), dtype=np.float32) for a in w0],
            pending_weight=[np.zeros(0, dtype=np.float64)],
            origin=[a.copy() for a in w0],
            centroids=[np.zeros((k, gr.SKETCH_DIM), dtype=np.float32)])

    @staticmethod
    def cluster_of(state: ClusteredState, cid: int) -> int:
        a = state.assignment[0]
        return int(a[cid]) if cid < len(a) else 0

    @staticmethod
    def model(state: ClusteredState, cluster: int) -> Weights:
        return [m[cluster].copy() for m in state.models]

    @staticmethod
    def trained(sketch: np.ndarray, num_clients: int) -> np.ndarray:
        """[bool (num_clients,)]: the clients that have trained (a nonzero sketched move):
        the members of a cluster; the others have no cluster yet."""
        mask = np.zeros(num_clients, dtype=bool)
        rows = min(len(sketch), num_clients)
        mask[:rows] = np.linalg.norm(sketch[:rows], axis=1) > 0
        return mask

    def evaluated_model(self, state: ClusteredState, partition_id: int,
                        w_t: Weights) -> Weights | None:
        """A client that has never trained (so has no cluster) is scored on what a newcomer
        has before it chooses: the member-weighted mean of the cluster models (``global_of``);
        a member on its cluster's model (None: ``down_to``'s)."""
        sketch = state.sketch[0]
        if partition_id < len(sketch) and bool(sketch[partition_id].any()):
            return None
        return self.global_of(state.assignment[0], state.models,
                              self.trained(sketch, len(state.assignment[0])))

    def evaluation_choices(self, state: ClusteredState, partition_id: int
                           ) -> list[Weights] | None:
        """``cluster-serve=lowest-loss`` once there are clusters (after ``loss``'s warm-up):
        the model of every cluster that has a trained member (every cluster before any has)."""
        k = len(state.models[0])
        if self.params.cluster_serve != "lowest-loss" or k < 2 or (
                self.by_loss and int(state.clustered[0][0]) == 0):
            return None
        assignment = state.assignment[0]
        members = self.trained(state.sketch[0], len(assignment))
        used = np.unique(assignment[members]) if members.any() else np.arange(k)
        return [self.model(state, int(c)) for c in used]

    @property
    def by_loss(self) -> bool:
        return self.params.cluster_assign == "loss"

    def down_to(self, state: ClusteredState, partition_id: int, w_t: Weights) -> ClientDown:
        """The client's cluster model, its index and the other cluster models to choose
        from (under ``loss`` once the warm-up has clustered; none otherwise)."""
        c = self.cluster_of(state, partition_id)
        self.k = len(state.models[0])
        choose = self.by_loss and int(state.clustered[0][0]) > 0 and self.k > 1
        others = [np.delete(m, c, axis=0) if choose else m[:0] for m in state.models]
        sketch = state.sketch[0]
        member = choose and partition_id < len(sketch) and bool(sketch[partition_id].any())
        probe = choose and not member and self.params.cluster_newcomer == "probe"
        return ClientDown(self.model(state, c), {
            OTHERS: others, CURRENT: [np.asarray([c], dtype=np.int64)],
            MEMBER: [np.asarray([int(member)], dtype=np.int64)],
            ORIGIN: [a[None] if probe else a[None][:0] for a in state.origin],
            CENTROIDS: [state.centroids[0] if probe else state.centroids[0][:0]]})

    def reply_problem(self, update: ClientUpdate, expected_steps: int | None) -> str | None:
        """The cluster choice must be an int naming a cluster (it picks the model the
        reply's move is taken from and the cluster it is added to)."""
        k = self.k
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
        one it chose) is added to its cluster's model. Under ``loss`` the warm-up's moves
        wait (the models stay w_0) until its last round clusters them; after it, a cluster
        whose replies point apart splits into an empty one. Under ``kmeans`` k-means when due,
        after the moves (a new cluster takes an old one's model)."""
        assert rnd.variant == "model"
        n, k = rnd.num_clients, len(state.models[0])
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
        clustered, centroids = state.clustered, state.centroids
        pending, pending_weight = state.pending, state.pending_weight
        splits: list[dict[str, float]] = []
        chose: dict[str, object] = {}
        if (k > 1 or self.auto) and self.by_loss and int(state.clustered[0][0]) == 0:
            pending = [gr.grown_rows(m, n) for m in state.pending]
            weights = gr.grown_rows(state.pending_weight[0], n)
            for cid, move, weight in moves:
                for m, mv in zip(pending, move, strict=True):
                    m[cid] = mv
                weights[cid] = weight
            pending_weight = [weights]
            known = np.flatnonzero(weights > 0)
            if rnd.server_round < self.params.cluster_warmup or len(known) < (
                    cc.MIN_CLIENTS if self.auto else k):
                return self.global_of(assignment, models, self.trained(sketch, n)), \
                    dataclasses.replace(state, assignment=[assignment], sketch=[sketch],
                                        pending=pending, pending_weight=pending_weight)
            unit = gr.unit_rows(sketch[known])
            if self.auto:  # K from the warm-up's moves; every model starts at w_0
                count = cc.choose_k(unit, seed=rnd.server_round, restarts=KMEANS_RESTARTS)
                labels, k = count.labels, count.k
                models = [np.repeat(o[None], k, axis=0) for o in state.origin]
                chose = {"num-clusters": k,
                         "silhouette": {str(j): round(v, 4) for j, v in count.scores.items()},
                         "tried": {str(j): tried_assignment(assignment, known, lab)
                                   for j, lab in count.tried.items()}}
                self.k = k
            else:
                labels = kmeans(unit, k, seed=rnd.server_round, restarts=KMEANS_RESTARTS)
            assignment[known] = labels
            centroids = [gr.unit_rows(np.stack([
                unit[labels == c].sum(axis=0) for c in range(k)])).astype(np.float32)]
            moves = [(int(cid), [m[cid] for m in pending], float(weights[cid]))
                     for cid in known]
            clustered = [np.asarray([rnd.server_round], dtype=np.int64)]
            pending = [m[:0] for m in pending]
            pending_weight = [weights[:0]]
        elif k > 1 and self.by_loss and self.params.cluster_split > -1.0:
            assignment, models, splits = self.split(assignment, sketch, models, moves)
        by_cluster: dict[int, list[tuple[Weights, float]]] = {}
        for cid, move, weight in moves:
            by_cluster.setdefault(int(assignment[cid]), []).append((move, weight))
        for c, mine in sorted(by_cluster.items()):
            total = sum(wt for _, wt in mine)
            for i, m in enumerate(models):
                mean = sum(wt * mv[i] for mv, wt in mine) / total
                m[c] = (m[c].astype(np.float64) + rnd.server_lr * mean).astype(m.dtype)
        if k > 1 and not self.by_loss and (
                rnd.server_round == 1 or rnd.server_round % self.params.cluster_every == 0):
            assignment, models = self.recluster(assignment, sketch, models, rnd.server_round)
        if not np.array_equal(assignment, before) or splits or chose:
            self.report(assignment, rnd.server_round, splits, chose)
        return self.global_of(assignment, models, self.trained(sketch, n)), dataclasses.replace(
            state, models=models, assignment=[assignment], sketch=[sketch],
            clustered=clustered, pending=pending, pending_weight=pending_weight,
            centroids=centroids)

    @staticmethod
    def global_of(assignment: np.ndarray, models: Weights, members: np.ndarray) -> Weights:
        """The member-weighted mean of the cluster models: each model weighted by the clients
        in ``members`` (the trained ones) it holds; equal weights before any (the central
        accuracy curve, and what a client with no cluster is evaluated on)."""
        k = len(models[0])
        counts = np.bincount(assignment[members], minlength=k).astype(np.float64)
        share = counts / counts.sum() if counts.sum() > 0 else np.full(k, 1.0 / k)
        return [np.tensordot(share, m.astype(np.float64), axes=1).astype(m.dtype)
                for m in models]

    def split(self, assignment: np.ndarray, sketch: np.ndarray, models: Weights,
              moves: list[tuple[int, Weights, float]]
              ) -> tuple[np.ndarray, Weights, list[dict[str, float]]]:
        """CFL's split (Sattler et al.): for each cluster (by index) with two or more
        replies this round, while a cluster holds no trained client, bipartition the replies'
        moves (all from that cluster's model) and, where every cosine across the two groups
        is below ``cluster-split``, move the group without the round's lowest client id to
        the lowest empty cluster, which starts from the split cluster's model."""
        assignment = assignment.copy()
        models = [m.copy() for m in models]
        trained = np.linalg.norm(sketch, axis=1) > 0
        empty = sorted(set(range(len(models[0]))) - set(assignment[trained].tolist()))
        splits: list[dict[str, float]] = []
        by_cluster: dict[int, list[tuple[int, Weights]]] = {}
        for cid, move, _ in sorted(moves, key=lambda t: t[0]):
            by_cluster.setdefault(int(assignment[cid]), []).append((cid, move))
        for c, mine in sorted(by_cluster.items()):
            if len(mine) < 2 or not empty:
                continue
            flat = np.stack([np.concatenate([a.ravel() for a in mv]) for _, mv in mine])
            groups, cross = bipartition(flat)
            if cross >= self.params.cluster_split:
                continue
            target = empty.pop(0)
            for (cid, _), g in zip(mine, groups, strict=True):
                if g == 1:
                    assignment[cid] = target
            for m in models:
                m[target] = m[c]
            splits.append({"from": c, "to": target, "cross-cosine": round(cross, 4)})
        return assignment, models, splits

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

    def report(self, assignment: np.ndarray, server_round: int,
               splits: list[dict[str, float]] | None = None,
               chose: dict[str, object] | None = None) -> None:
        """One line of ``clusters.jsonl``: the round, every client's cluster, the round's
        splits (``{"from", "to", "cross-cosine"}``; the key only when there were some) and,
        where the warm-up chose K (``num-clusters=0``), ``num-clusters``, each k's
        ``silhouette`` and each k's assignment (``tried``: rules for K judged offline)."""
        if self.results is None:
            return
        line: dict[str, object] = {"round": server_round,
                                   "assignment": [int(a) for a in assignment]}
        if splits:
            line["splits"] = splits
        if chose:
            line.update(chose)
        self.results.append_line(CLUSTERS_FILE, json.dumps(line))


def candidates(job: LocalJob) -> list[Weights]:
    """The cluster models a client may choose from, by index: the message's model at its
    index (``CURRENT``) among the others (``OTHERS``)."""
    current = int(np.asarray(job.down[CURRENT][0]).reshape(-1)[0])
    others = job.down[OTHERS]
    count = int(others[0].shape[0]) if others else 0
    models: list[Weights] = [[o[j] for o in others] for j in range(count)]
    models.insert(current, list(job.w_t))
    return models


def choose(losses: list[float], current: int | None = None, margin: float = 0.0) -> int:
    """The lowest loss (NaN counts as +inf; ties: the lowest index); a member (``current``,
    its cluster) stays unless that loss is below (1 - ``margin``) x its cluster's."""
    values = np.asarray(losses, dtype=np.float64)
    values = np.where(np.isnan(values), np.inf, values)
    best = int(np.argmin(values))
    if current is None or best == current or not np.isfinite(values[current]):
        return best
    return best if values[best] < (1.0 - margin) * values[current] else current


def nearest(sketch: np.ndarray, centroids: np.ndarray) -> int:
    """The centroid with the largest cosine to ``sketch`` (ties: the lowest index)."""
    return int(np.argmax(centroids.astype(np.float64) @ gr.unit_rows(sketch[None])[0]))


class ClusteredClient(ClientRule[ClusteredParams]):
    """Picks the cluster model with the lowest mean loss on its own training data (when sent
    more than one), trains it with FedAvg's local SGD, reports the choice."""

    down_keys = (OTHERS, CURRENT, MEMBER, ORIGIN, CENTROIDS)

    def train(self, job: LocalJob) -> LocalOutcome:
        models = candidates(job)
        if len(models) == 1:  # only its cluster's model (k-means, or round 1)
            trained = job.sgd(job.w_t)
            choice = int(np.asarray(job.down[CURRENT][0]).reshape(-1)[0])
            return LocalOutcome(trained, dict(job.state), {}, {CHOICE: choice})
        if job.losses is None:
            raise ValueError("clustered FL with cluster-assign=loss needs the client's "
                             "training losses (LocalJob.losses); this client shell gives none")
        current = int(np.asarray(job.down[CURRENT][0]).reshape(-1)[0])
        member = bool(np.asarray(job.down[MEMBER][0]).reshape(-1)[0])
        if job.down[ORIGIN][0].shape[0] == 1:  # a newcomer's probe from w_0
            probe = job.sgd([o[0] for o in job.down[ORIGIN]])
            move = [np.asarray(a, dtype=np.float64) - o[0].astype(np.float64)
                    for a, o in zip(probe.final, job.down[ORIGIN], strict=True)]
            choice = nearest(gr.sketch(move), job.down[CENTROIDS][0])
            return LocalOutcome(job.sgd(models[choice]), dict(job.state), {},
                                {CHOICE: choice})
        choice = choose(job.losses(models), current if member else None,
                        self.params.cluster_margin)
        return LocalOutcome(job.sgd(models[choice]), dict(job.state), {}, {CHOICE: choice})


SPEC = MethodSpec(name="clustered", label="Clustered FL", params=ClusteredParams,
                  server=ClusteredServer, client=ClusteredClient, ri_aggregation="model",
                  async_refusal=("it re-clusters the replies of one round; a buffer's replies "
                                 "started from different versions of each cluster model"),
                  secagg_refusal="the server clusters the clients' individual updates")
