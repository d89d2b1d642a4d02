"""FedRelax (book section 5.6, eq. (123)): GTVMin over the FL network by local relaxation.

GTVMin (eq. (58)): min over w^(1..n) of sum_i L_i(w^(i)) + alpha sum_{edges} A_ii' ||w^(i) -
w^(i')||^2. Each client keeps its own model w^(i) (client state ``fedrelax-w``); when sampled
it minimizes L_i(w) + alpha sum_i' A_ii' ||w - w^(i')||^2 = L_i(w) + alpha d_i ||w - m_i||^2 +
const by the run's local SGD from its stored model, where d_i = sum_i' A_ii' is its degree and
m_i = sum_i' A_ii' w^(i') / d_i the A-weighted mean of its neighbours' latest models: the
gradient gains 2 alpha d_i (w - m_i). A fixed point of these updates is a stationary point of
GTVMin (its gradient in w^(i) is that of the local objective).

Server: keeps each client's latest uploaded model on disk (``ModelFiles``, one file per client
and version; the checkpointed state names the current version of each), builds m_i from the
neighbours' files when it sends to client i, and sends ONE model-shaped array (m_i, in place of
the global model) plus d_i; a client with no neighbour gets its own stored model back and
trains on L_i alone. A client never receives a single other client's model unless that client
is its only neighbour (non-zero weight). The "global" model the server returns each round is
the mean of all clients' current models (the central accuracy curve); personal evaluation
scores each client's own w^(i).

Graph (``graph``): ``file:<path>`` of weighted edges (``fedinit/methods/graph.py``), or ``knn``:
every client that has trained linked to its ``graph-k`` most cosine-similar clients by their latest
update (its upload minus its previous model, sketched), rebuilt after round 1 and every
``graph-refresh-every`` rounds; no edges before round 1 ends; or ``loss``: learned from how
well each candidate neighbour's model fits a client's own data (``fedinit/methods/graph_loss.py``):
a client sampled from round 2 on, at its first participation, once ``graph-refresh-every``
rounds have passed since its last measurement, and when more candidates are available than its
last choice was made from, is also sent up to
``graph-candidates`` other clients' latest models (the server's copies), reports the mean loss
of each on its own training data (one float per candidate) before it trains, and is linked to
its ``graph-k`` lowest, none past the widest gap among its 2k lowest (A = 1; the union of the
clients' choices). Under ``relax-warmup`` the loss graph also keeps each warm-up reply's upload
(w_iK, trained from the shared model on the client's data: the server received it anyway) as
that client's candidate model until it uploads after the warm-up, so the first measurements
come in round R+1 and score every client the warm-up trained. The graph in use is written
to the run directory (``graph.json``, ``graph.png``) each time it changes.

Neighbourhoods that learn from every participation (``relax-server-step`` beta > 0; issue 45):
after each GTVMin round the server moves every client that did not reply and has a neighbour
toward its neighbours' mean, w^(i) <- w^(i) - beta/d_i sum_i' A_ii' (w^(i) - w^(i')) =
(1 - beta) w^(i) + beta m_i, all from the models as they stand after the round's replies (one
Jacobi step): the GTV part of GTVMin's gradient step at step size beta / (2 alpha d_i), which
needs no data. A client's model then moves whenever its neighbours train, not only when it is
sampled (6 of 30 a round: 2-4 times in 20 rounds). The stepped models are stored like uploads
(a new version, the checkpointed one kept) and every message after the warm-up carries the
server's copy of the client's model (``START``), so the client trains from what the server
accounted; its stored w^(i) (personal accuracy (c)) is the one of its last participation.

Groups that train one model each (``relax-train=groups``; issue 45): after the warm-up each
group of the graph (``graph_groups``: under ``graph=loss`` the components of the mutual
choices, a client in none joined by its choices' majority, the rest pooled) keeps one model,
every member's server copy: a sampled client trains from it (``START``) and the server
replaces it by the example-weighted mean of the members' replies (FedAvg within the group,
``group_steps``), so the group's model learns from every participation of its members. Each
client's candidate model is then its own last upload, filed under -1 - id; the loss graph also
measures during the warm-up, so the groups exist when it ends.

Groups by loss (``relax-groups-by=loss``, with ``groups``; issue 45): the graph's groups at the
end of the warm-up seed the membership (``team``, numbered by ``graph_groups.numbered``: the
pool 0; under ``graph=loss`` a pooled client whose warm-up model fit another client's data
best, ``nearest``, is seeded into that client's group, ``graph_groups.placed``), and from then
on the loss moves clients between them, as clustered FL's IFCA rule (Ghosh, Chung, Yin and
Ramchandran 2020, "An efficient framework for clustered federated learning"): a sampled client
is sent every non-empty group's model (``graph_loss``'s candidate channel, ids = the groups)
and its group's position (``GROUP``), reports the loss of each on its own training data
(``fedrelax-loss-<group>``), joins the lowest unless it is not below (1 -
``relax-group-margin``) x its own group's (``graph_groups.joined``; no margin for a client that
has never uploaded), and trains that group's model; the server makes the same choice from the
reported losses and steps the group the client joined. The loss graph measures nothing after
the warm-up. ``relax-group-split`` c > -1 adds CFL's split (Sattler, Mueller and Samek 2020,
``clustered.bipartition``): a group with two or more replies in a round whose moves bipartition
with every cross cosine below c loses the half without the round's lowest client id to a new
group, which starts from the same model; ``groups.jsonl`` logs each such group's cross cosine
and the splits. Personalized evaluation serves a client its group's model once it has chosen;
before, the group model of the client whose data fit its warm-up upload best (``nearest``), as
that client's group stands, else its seeded group's; the warm model to one that has never
uploaded (nothing tells its group).

Under ``rounds=async`` (book eq. (128)) each task's m_i is built when it is sent, from the
models the server holds then, and a flush replaces each buffered client's model (its last
reply): ``replaces_models``; only a ``file:`` graph (``async_refusal``).

RI and DP are refused: RI's start point is built from a global model the clients do not train
from (each starts from its own w^(i), which is what RI's w_prev carries), and the server needs
each client's exact model, which DP's clipped, noised uploads are not.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedinit.methods import graph as gr
from fedinit.methods import graph_groups as gg
from fedinit.methods import graph_loss as gl
from fedinit.methods.clustered import bipartition
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
    Scalar,
    ServerRule,
    ServerState,
    apply_step,
    check_range,
    proximal_hook,
)
from fedinit.methods.weights import Weights, stacked, unstacked

OWN = "fedrelax-w"
"""Client state: the client's own model w^(i)."""
DEGREE = "fedrelax-degree"
"""Down array: the client's degree d_i = sum_i' A_ii' (one number)."""
WARMUP = "fedrelax-warmup"
"""Down array: 1.0 in a warm-up round (train the shared model sent, FedAvg's pass), else 0.0."""
START = "fedrelax-start"
"""Down arrays: the server's copy of the client's model stacked once, the client's w^(i)
becomes it before training: the warm-up's model for a client whose w^(i) is still it (none
uploaded since the warm-up), and under ``relax-server-step`` every time (the server may have
stepped it); empty otherwise."""
NO_GROUP = np.zeros(0, dtype=np.int64)
"""``GROUP``'s value when the client does not choose."""
GRAPH_FILE = "graph.json"
GRAPH_PNG = "graph.png"
GROUPS_FILE = "groups.jsonl"
"""``relax-train=groups``: one line per round after the warm-up, the groups its update used."""
DRAW_LIMIT = 500
"""Largest federation whose graph is drawn (a PNG of more nodes shows nothing)."""
SERVE_RULES = ("mean", "own", "chosen", "lowest-loss")
"""``relax-serve``'s values (``FedRelaxServer.served``; ``lowest-loss``:
``FedRelaxServer.evaluation_choices``)."""
GROUP = "fedrelax-group"
"""Down array: [int64 (1,)] under ``relax-groups-by=loss`` after the warm-up: the position, among
the candidates (the groups' models), of the client's own group (-1: a newcomer, no upload yet,
which takes the lowest loss without a margin); empty otherwise."""
GROUPS_BY = ("graph", "loss")
"""``relax-groups-by``'s values: the graph's groups every round, or seeded by them when the
warm-up ends and moved by each client's losses (IFCA)."""
TRAIN_RULES = ("gtv", "groups")
"""``relax-train``'s values: each client's own model (GTVMin, the default) or one model per
group of the graph (``graph_groups``)."""
PER_CLIENT = ("each client trains from its own model, not from a global one, and the server "
              "needs every client's exact model for its neighbours' terms")


@dataclass(frozen=True)
class FedRelaxParams(Params):
    fedrelax_alpha: float
    """alpha: the weight of the GTV term; 0 = local training only."""
    graph: str
    """``knn`` or ``loss`` (learned) or ``file:<path>`` (edges ``i j [weight]``)."""
    graph_k: int
    """Neighbours per client in the learned graph."""
    graph_refresh_every: int
    """Rounds between rebuilds of the learned graph (knn: after round 1 and every this many;
    loss: between one client's measurements)."""
    graph_candidates: int
    """``graph=loss``: the most candidate models one client scores at a measurement."""
    relax_warmup: int
    """Rounds of FedAvg on one shared model before GTVMin starts from it (0: none)."""
    relax_server_step: float
    """beta: after each GTVMin round every client that did not reply moves this fraction of
    the way to its neighbours' mean (0: off)."""
    relax_server_rule: str
    """``mean``: the step is toward the neighbours' mean; ``moves``: by beta times the
    A-weighted mean of the moves of the neighbours that trained this round."""
    relax_serve: str
    """What personalized evaluation serves a client as its (a) after the warm-up: ``mean``
    (m_i, its train message's model), ``own`` (its own model counted in: (w^(i) + d_i m_i) /
    (1 + d_i)) or ``chosen`` (``graph=loss``: the mean of w^(i) and the models of its own
    lowest-loss choice, without the clients that only chose it; ``own``'s without a choice) or
    ``lowest-loss`` (``relax-groups-by=loss``: every group's model is sent and the client is
    scored on the one with the lowest loss on its own training data, IFCA's inference)."""
    relax_train: str
    """After the warm-up, ``gtv``: each client trains its own w^(i) (GTVMin); ``groups``: each
    group of the graph (``graph_groups``) keeps one model, trained by FedAvg within the group."""
    relax_groups_by: str
    """Under ``groups``, ``graph``: the graph's groups, every round; ``loss``: seeded by them
    when the warm-up ends, then each sampled client joins the group whose model has the lowest
    loss on its own data (IFCA)."""
    relax_group_margin: float
    """``relax-groups-by=loss``: a client leaves its group only for a loss below (1 - this) x
    its own group model's (0: the lowest loss, ties kept)."""
    relax_group_split: float
    """``relax-groups-by=loss``: a group whose round replies bipartition with every cross-pair
    cosine of their moves below this splits in two (CFL); -1: never."""

    def check(self) -> None:
        check_range("fedrelax-alpha", self.fedrelax_alpha, self.fedrelax_alpha >= 0,
                    "a number >= 0 (0 = local training only)")
        check_range("graph", self.graph, self.graph in ("knn", gl.SOURCE) or (
            self.graph.startswith(gr.FILE_PREFIX) and len(self.graph) > len(gr.FILE_PREFIX)),
            "knn | loss | file:<path of an edge list 'i j [weight]' per line>")
        check_range("graph-k", self.graph_k, self.graph_k >= 1, "an integer >= 1")
        check_range("graph-refresh-every", self.graph_refresh_every,
                    self.graph_refresh_every >= 1, "an integer >= 1")
        check_range("graph-candidates", self.graph_candidates,
                    self.graph_candidates >= self.graph_k,
                    f"an integer >= graph-k ({self.graph_k})")
        check_range("relax-warmup", self.relax_warmup, self.relax_warmup >= 0,
                    "an integer >= 0 (rounds of FedAvg before GTVMin; 0 = none)")
        check_range("relax-server-step", self.relax_server_step,
                    0.0 <= self.relax_server_step <= 1.0,
                    "a number in [0, 1] (the move toward the neighbours' mean; 0 = off)")
        check_range("relax-server-rule", self.relax_server_rule,
                    self.relax_server_rule in ("mean", "moves"), "mean | moves")
        check_range("relax-serve", self.relax_serve,
                    self.relax_serve in SERVE_RULES, " | ".join(SERVE_RULES))
        check_range("relax-train", self.relax_train,
                    self.relax_train in TRAIN_RULES, " | ".join(TRAIN_RULES))
        if self.grouped:
            check_range("relax-server-step", self.relax_server_step,
                        self.relax_server_step == 0.0,
                        "0 with relax-train='groups' (the group's FedAvg step moves every "
                        "member already)")
        check_range("relax-groups-by", self.relax_groups_by,
                    self.relax_groups_by in GROUPS_BY, " | ".join(GROUPS_BY))
        check_range("relax-group-margin", self.relax_group_margin,
                    0.0 <= self.relax_group_margin < 1.0, "a fraction in [0, 1)")
        check_range("relax-group-split", self.relax_group_split,
                    -1.0 <= self.relax_group_split <= 1.0, "a cosine in [-1, 1] (-1: never split)")
        if self.choosing:
            check_range("relax-groups-by", self.relax_groups_by, self.grouped,
                        "graph with relax-train='gtv' (loss moves clients between the groups "
                        "that relax-train='groups' trains)")
            check_range("relax-groups-by", self.relax_groups_by, self.relax_warmup >= 1,
                        "graph with relax-warmup=0 (the graph's groups at the warm-up's end seed "
                        "the membership)")
        else:
            check_range("relax-serve", self.relax_serve, self.relax_serve != "lowest-loss",
                        "mean | own | chosen with relax-groups-by='graph' (lowest-loss chooses "
                        "among the groups relax-groups-by='loss' trains)")
            check_range("relax-group-split", self.relax_group_split,
                        self.relax_group_split == -1.0,
                        "-1 with relax-groups-by='graph' (a split needs the membership that "
                        "relax-groups-by='loss' keeps)")

    @property
    def grouped(self) -> bool:
        return self.relax_train == "groups"

    @property
    def choosing(self) -> bool:
        """``relax-groups-by=loss``: the clients choose their groups by loss (IFCA)."""
        return self.relax_groups_by == "loss"

    @property
    def learned(self) -> bool:
        return self.graph in ("knn", gl.SOURCE)


@dataclass(frozen=True)
class FedRelaxState(ServerState):
    """Everything but the models themselves (those are files): checkpointed."""

    w0: Weights
    """The model every client's w^(i) starts from, the server's copy of a client that has not
    uploaded since: w_0, or once ``relax-warmup`` rounds have ended, the warm-up's model."""
    version: Weights
    """[int64 (N,)]: the round of each client's current stored model (0: none yet)."""
    graph: Weights
    """[edges (E, 2) int64, weights (E,) float64]: the graph in use."""
    sketch: Weights
    """[float32 (N, SKETCH_DIM)]: each client's latest update, sketched (knn graph)."""
    chosen: Weights
    """[int64 (N, graph-k)]: each client's lowest-loss candidates (-1: empty; loss graph)."""
    measured: Weights
    """[int64 (N,)]: the round of each client's last measurement (0: none; loss graph)."""
    pool: Weights
    """[int64 (N,)]: how many candidates each client's last measurement scored (loss graph)."""
    clock: Weights
    """[int64 (1,)]: the rounds completed (which round the next messages are for)."""
    probe: Weights
    """[int64 (N,)]: the warm-up round whose upload (the client's local model w_iK, trained
    from the shared model) is its candidate model until it uploads after the warm-up (0:
    none; ``graph=loss`` with ``relax-warmup``)."""
    nearest: Weights
    """[float64 (N, 2)]: per client, [1 + the client whose data gave its candidate model the
    lowest loss reported so far (0: none), that loss] (``graph=loss``; ``relax-serve``
    serves a client without an edge from that client's group)."""
    team: Weights
    """[int64 (N,)]: each client's group under ``relax-groups-by=loss`` once the warm-up has
    seeded them (empty before, and under ``graph``)."""

    @classmethod
    def from_arrays(cls, saved: Mapping[str, Weights]) -> ServerState:
        """As ``ServerState``'s, and a checkpoint written before ``probe`` or ``nearest``
        existed resumes with none (what that code kept)."""
        if "probe" not in saved:
            saved = {**saved, "probe": [np.zeros(0, dtype=np.int64)]}
        if "nearest" not in saved:
            saved = {**saved, "nearest": [np.zeros((0, 2), dtype=np.float64)]}
        if "team" not in saved:
            saved = {**saved, "team": [np.zeros(0, dtype=np.int64)]}
        return super().from_arrays(saved)


class FedRelaxServer(ServerRule[FedRelaxParams, FedRelaxState]):
    """Stores the uploads, sends each client its neighbourhood term, learns the graph."""

    state_type = FedRelaxState
    per_client_refusal = PER_CLIENT
    robust_refusal = ("each client's model is its own; there is no aggregate for a robust "
                      "rule to build")
    replaces_models = True

    @classmethod
    def async_refusal(cls, values: Mapping[str, Any]) -> tuple[str, Any, str, str] | None:
        """Under ``rounds=async`` only a given graph: the loss graph's measurements are
        matched to a client's last message at the round's end, and the knn graph's rebuilds
        are counted in rounds; neither is built for tasks that outlive a flush."""
        warmup = values["relax-warmup"]
        if warmup != 0:
            return ("relax-warmup", warmup, "0 with method='fedrelax'",
                    "the warm-up's FedAvg rounds and the switch to GTVMin are counted in rounds; "
                    "not built for tasks that outlive a flush")
        train = values.get("relax-train", "gtv")
        if train != "gtv":
            return ("relax-train", train, "gtv with method='fedrelax'",
                    "a group's FedAvg step is taken at a round's end; not built for tasks "
                    "that outlive a flush")
        step = values.get("relax-server-step", 0.0)
        if step != 0.0:
            return ("relax-server-step", step, "0 with method='fedrelax'",
                    "the server's neighbourhood steps are taken at a round's end; not built for "
                    "tasks that outlive a flush")
        graph = values["graph"]
        if graph not in ("knn", gl.SOURCE):
            return None
        return ("graph", graph, "file:<path> with method='fedrelax'",
                "a learned graph is rebuilt from one round's replies and messages; not built "
                "for tasks that outlive a flush")

    def __init__(self, params: FedRelaxParams) -> None:
        super().__init__(params)
        self.models: ModelFiles | None = None
        self.results: ReportFiles | None = None
        self.sent: dict[int, np.ndarray] = {}
        """Client id -> the candidates its last message carried (``graph=loss``): a reply's
        losses must be for exactly these."""

    def bind(self, models: ModelFiles, results: ReportFiles | None) -> None:
        self.models, self.results = models, results

    def init(self, w0: Weights) -> FedRelaxState:
        graph = (gr.empty() if self.params.learned
                 else gr.read_edges(Path(self.params.graph.removeprefix(gr.FILE_PREFIX))))
        return FedRelaxState(w0=[a.copy() for a in w0], version=[np.zeros(0, dtype=np.int64)],
                             graph=graph,
                             sketch=[np.zeros((0, gr.SKETCH_DIM), dtype=np.float32)],
                             chosen=[np.zeros((0, self.params.graph_k), dtype=np.int64)],
                             measured=[np.zeros(0, dtype=np.int64)],
                             pool=[np.zeros(0, dtype=np.int64)],
                             clock=[np.zeros(1, dtype=np.int64)],
                             probe=[np.zeros(0, dtype=np.int64)],
                             nearest=[np.zeros((0, 2), dtype=np.float64)],
                             team=[np.zeros(0, dtype=np.int64)])

    def model_of(self, state: FedRelaxState, cid: int) -> Weights:
        """The server's copy of client ``cid``'s current model (w_0 before its first upload)."""
        version = state.version[0]
        if cid >= len(version) or version[cid] == 0:
            return state.w0
        assert self.models is not None
        return self.models.read(cid, int(version[cid]))

    def candidate_model(self, state: FedRelaxState, cid: int) -> Weights:
        """The model client ``cid`` is scored by (``graph=loss``): its latest upload after
        the warm-up, else its last warm-up upload (``probe``), else its server copy."""
        version, probe = state.version[0], state.probe[0]
        if self.params.grouped and cid < len(probe) and probe[cid] > 0:
            assert self.models is not None  # relax-train=groups: its own last upload, always
            return self.models.read(self.candidate_id(cid), int(probe[cid]))
        if (cid >= len(version) or version[cid] == 0) and cid < len(probe) and probe[cid] > 0:
            assert self.models is not None
            return self.models.read(cid, int(probe[cid]))
        return self.model_of(state, cid)

    def candidate_id(self, cid: int) -> int:
        """Where client ``cid``'s candidate model (``probe``) is filed: under its own id, or
        under ``relax-train=groups``, where its own id holds its group's model, under -1 - cid
        (its last upload, trained on its data: members of one group share a model, which
        would score them all alike)."""
        return -1 - cid if self.params.grouped else cid

    def groups(self, state: FedRelaxState, n: int) -> np.ndarray:
        """[int64 (n,)]: each client's group (``graph_groups``): the components of the mutual
        choices under ``graph=loss`` (a client in none joined to the group most of its choices
        are in, the clients still alone pooled in one group), else of the graph in use; under
        ``relax-groups-by=loss`` once seeded, the clients' chosen groups (``team``; a client
        beyond it in group 0, the pool)."""
        team = state.team[0]
        if self.params.choosing and len(team):
            return gr.grown_rows(team, n)
        if self.params.graph == gl.SOURCE:
            chosen = gl.grown_choice(state.chosen[0], n)
            return gg.pooled(gg.attached(gg.components(gg.mutual_graph(chosen), n), chosen))
        return gg.components(state.graph, n)

    def group_model(self, state: FedRelaxState, cid: int,
                    labels: np.ndarray | None = None) -> Weights:
        """The model of client ``cid``'s group (``labels``, else ``groups``): the mean of its
        members' server copies (each member holds the group's model once the group has
        trained; after groups merge, their mean)."""
        if labels is None:
            labels = self.groups(state, self.size(state, cid))
        ids = gg.members(labels, cid)
        if len(ids) == 1:
            return self.model_of(state, cid)
        total = [np.zeros(a.shape, dtype=np.float64) for a in state.w0]
        for j in ids:
            for acc, w in zip(total, self.model_of(state, int(j)), strict=True):
                acc += w.astype(np.float64)
        return [(t / len(ids)).astype(w.dtype) for t, w in zip(total, state.w0, strict=True)]

    @staticmethod
    def size(state: FedRelaxState, cid: int) -> int:
        """The clients the state knows of, ``cid`` included."""
        return max(cid + 1, len(state.version[0]), len(state.probe[0]), len(state.team[0]))

    @staticmethod
    def scoreable(state: FedRelaxState) -> np.ndarray:
        """[int64 (N,)], > 0 where a client has a model to be scored by: an upload after the
        warm-up or a warm-up upload kept as its candidate model."""
        version, probe = state.version[0], state.probe[0]
        n = max(len(version), len(probe))
        return np.maximum(gr.grown_rows(version, n), gr.grown_rows(probe, n))

    def term(self, state: FedRelaxState, cid: int) -> tuple[Weights, float]:
        """(m_i, d_i): the A-weighted mean of client ``cid``'s neighbours' models and its
        degree; its own model and 0 without neighbours."""
        ids, weights = gr.neighbours(state.graph, cid)
        degree = float(weights.sum())
        if degree == 0.0:
            return self.model_of(state, cid), 0.0
        total = [np.zeros(a.shape, dtype=np.float64) for a in state.w0]
        for j, a in zip(ids, weights, strict=True):
            for acc, w in zip(total, self.model_of(state, int(j)), strict=True):
                acc += a * w.astype(np.float64)
        return [(t / degree).astype(w.dtype) for t, w in zip(total, state.w0, strict=True)], degree

    def evaluated_model(self, state: FedRelaxState, partition_id: int,
                        w_t: Weights) -> Weights | None:
        """``relax-serve`` other than ``mean``, after the warm-up: ``served``'s model (the
        train message still carries m_i, so training is unchanged); else None (m_i)."""
        if self.warming(state):
            return None
        if self.params.choosing:
            return self.chosen_model(state, partition_id)
        if self.params.grouped:
            n = max(partition_id + 1, len(state.version[0]), len(state.probe[0]))
            if len(gg.members(self.groups(state, n), partition_id)) > 1:
                return self.group_model(state, partition_id)
        if self.params.relax_serve == "mean":
            return None
        return self.served(state, partition_id)

    def serving_group(self, state: FedRelaxState, cid: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, weights) of the others whose models ``served`` averages with w^(i)
        (``own_group``); for a client with none, under ``graph=loss``, the client whose data
        fit its candidate model best (``nearest``) and that client's own group, weight 1."""
        ids, weights = self.own_group(state, cid)
        nearest = state.nearest[0]
        if len(ids) or cid >= len(nearest) or nearest[cid, 0] == 0:
            return ids, weights
        near = int(nearest[cid, 0]) - 1
        more, more_weights = self.own_group(state, near)
        keep = more != cid
        return (np.concatenate([[near], more[keep]]).astype(np.int64),
                np.concatenate([[1.0], more_weights[keep]]))

    def own_group(self, state: FedRelaxState, cid: int) -> tuple[np.ndarray, np.ndarray]:
        """Its own lowest-loss choice under ``chosen`` with ``graph=loss`` (when it has one),
        else its graph neighbours (A_ij)."""
        chosen = state.chosen[0]
        if self.params.relax_serve == "chosen" and self.params.graph == gl.SOURCE and (
                cid < len(chosen)):
            row = chosen[cid][chosen[cid] != gl.NONE]
            if len(row):
                return row.astype(np.int64), np.ones(len(row))
        return gr.neighbours(state.graph, cid)

    def served(self, state: FedRelaxState, cid: int) -> Weights:
        """(w^(i) + sum_j a_j w^(j)) / (1 + sum_j a_j) over ``serving_group``: the client's own
        model counts once beside its group, so cross-regime edges weigh less. Each model is
        the client's candidate model: for one that has not uploaded or been stepped since the
        warm-up, its last warm-up upload (trained on its data, what the loss graph scored)
        rather than the warm model, so a client without an edge is served what data taught."""
        ids, weights = self.serving_group(state, cid)
        total = [w.astype(np.float64) for w in self.candidate_model(state, cid)]
        for j, a in zip(ids, weights, strict=True):
            for acc, w in zip(total, self.candidate_model(state, int(j)), strict=True):
                acc += float(a) * w.astype(np.float64)
        mass = 1.0 + float(np.sum(weights))
        return [(t / mass).astype(w.dtype) for t, w in zip(total, state.w0, strict=True)]

    def candidates_for(self, state: FedRelaxState, cid: int) -> np.ndarray:
        """The clients whose models ``cid`` scores in its next message (none unless
        ``graph=loss`` and its measurement is due)."""
        upcoming = int(state.clock[0][0]) + 1
        have = self.scoreable(state)
        if self.params.graph != gl.SOURCE or not gl.due(
                state.measured[0], state.pool[0], cid, upcoming,
                self.params.graph_refresh_every,
                gl.available(cid, have, self.params.graph_candidates)):
            return np.zeros(0, dtype=np.int64)
        return gl.candidates(cid, have, state.chosen[0], self.params.graph_candidates,
                             upcoming)

    @property
    def measures_in_warmup(self) -> bool:
        """``relax-train=groups`` with ``graph=loss``: the warm-up's messages carry the
        candidates due too (the warm-up uploads so far), so the groups exist when the group
        training starts rather than forming over the rounds after it."""
        return self.params.grouped and self.params.graph == gl.SOURCE

    def warming(self, state: FedRelaxState) -> bool:
        """Whether the next round is one of the ``relax-warmup`` rounds of FedAvg."""
        return int(state.clock[0][0]) < self.params.relax_warmup

    def down_to(self, state: FedRelaxState, partition_id: int, w_t: Weights) -> ClientDown:
        """In a warm-up round the shared model w_t (degree 0, the warm-up flag); after it
        m_i, d_i, the candidates due (``graph=loss``) and, to a client with no upload since
        the warm-up, the warm-up's model to start its w^(i) from."""
        if self.warming(state):
            ids = (self.candidates_for(state, partition_id) if self.measures_in_warmup
                   else np.zeros(0, dtype=np.int64))
            self.sent[partition_id] = ids
            return ClientDown(w_t, {DEGREE: [np.zeros(1, dtype=np.float64)],
                                    WARMUP: [np.ones(1, dtype=np.float64)],
                                    START: stacked([], state.w0),
                                    gl.CANDIDATES: stacked(
                                        [self.candidate_model(state, int(j)) for j in ids],
                                        state.w0),
                                    gl.CANDIDATE_IDS: [ids], GROUP: [NO_GROUP]})
        if self.params.choosing:
            return self.group_choice(state, partition_id)
        mean, degree = self.term(state, partition_id)
        ids = self.candidates_for(state, partition_id)
        self.sent[partition_id] = ids
        models = stacked([self.candidate_model(state, int(j)) for j in ids], state.w0)
        version = state.version[0]
        fresh = self.params.relax_warmup > 0 and (
            partition_id >= len(version) or version[partition_id] == 0)
        start = ([self.group_model(state, partition_id)] if self.params.grouped
                 else [self.model_of(state, partition_id)]
                 if fresh or self.params.relax_server_step > 0 else [])
        return ClientDown(mean, {DEGREE: [np.asarray([degree], dtype=np.float64)],
                                 WARMUP: [np.zeros(1, dtype=np.float64)],
                                 START: stacked(start, state.w0),
                                 gl.CANDIDATES: models, gl.CANDIDATE_IDS: [ids],
                                 GROUP: [NO_GROUP]})

    def group_choice(self, state: FedRelaxState, cid: int) -> ClientDown:
        """``relax-groups-by=loss`` after the warm-up: m_i and d_i as ever, every non-empty
        group's model as the candidates (ids: the groups, ascending) and the position of the
        client's own group among them; no start (the client trains the model it chooses)."""
        labels = self.groups(state, self.size(state, cid))
        ids, models = self.group_models(state, labels)
        self.sent[cid] = ids
        mean, degree = self.term(state, cid)
        own = -1 if self.newcomer(state, cid) else int(np.searchsorted(ids, labels[cid]))
        return ClientDown(mean, {DEGREE: [np.asarray([degree], dtype=np.float64)],
                                 WARMUP: [np.zeros(1, dtype=np.float64)],
                                 START: stacked([], state.w0),
                                 gl.CANDIDATES: stacked(models, state.w0),
                                 gl.CANDIDATE_IDS: [ids],
                                 GROUP: [np.asarray([own], dtype=np.int64)]})

    def group_models(self, state: FedRelaxState,
                     labels: np.ndarray) -> tuple[np.ndarray, list[Weights]]:
        """The non-empty groups of ``labels`` (ascending) and each one's model."""
        ids = np.unique(labels).astype(np.int64)
        return ids, [self.group_model(state, int(np.flatnonzero(labels == g)[0]), labels)
                     for g in ids]

    def evaluation_choices(self, state: FedRelaxState, partition_id: int
                           ) -> list[Weights] | None:
        """``relax-serve=lowest-loss`` after the warm-up: every non-empty group's model, the
        ones a train message offers (``group_choice``); the client is scored on the one that
        fits its training data best (IFCA's inference), also before its first choice."""
        if self.params.relax_serve != "lowest-loss" or self.warming(state):
            return None
        return self.group_models(state, self.groups(state, self.size(state, partition_id)))[1]

    def chosen_model(self, state: FedRelaxState, cid: int) -> Weights:
        """``relax-groups-by=loss``: what personalized evaluation serves client ``cid``: its
        group's model once it has chosen (uploaded after the warm-up); before, the current
        group model of the client whose data fit its warm-up upload best (``nearest``, the
        loss graph's evidence, that client's membership corrected by its own choices since),
        else its seeded group's; the warm model to a client that never uploaded."""
        if self.newcomer(state, cid):
            return state.w0
        nearest = state.nearest[0]
        if state.probe[0][cid] <= self.params.relax_warmup and cid < len(nearest) and (
                nearest[cid, 0] > 0):
            return self.group_model(state, int(nearest[cid, 0]) - 1)
        return self.group_model(state, cid)

    @staticmethod
    def newcomer(state: FedRelaxState, cid: int) -> bool:
        """``relax-groups-by=loss``: client ``cid`` has uploaded nothing yet, in the warm-up or
        after it (``probe``: the round of its last upload)."""
        probe = state.probe[0]
        return cid >= len(probe) or probe[cid] == 0

    def chosen_group(self, state: FedRelaxState, u: ClientUpdate, labels: np.ndarray) -> int:
        """The group a reply trained (``relax-groups-by=loss``): the client's choice among the
        groups it was sent, made again from its reported losses (``graph_groups.joined``)."""
        cid = u.partition_id
        sent = self.sent.get(cid, np.zeros(0, dtype=np.int64))
        if not len(sent):
            return int(labels[cid])
        own = -1 if self.newcomer(state, cid) else int(np.searchsorted(sent, labels[cid]))
        return int(sent[gg.joined(u.metrics, sent, own, self.params.relax_group_margin)])

    def reply_problem(self, update: ClientUpdate, expected_steps: int | None) -> str | None:
        """Under ``graph=loss``: one finite loss for each candidate the client was sent,
        none for another client."""
        if self.params.graph != gl.SOURCE:
            return None
        sent = self.sent.get(update.partition_id, np.zeros(0, dtype=np.int64))
        return gl.losses_problem(update.metrics, sent)

    def update(self, state: FedRelaxState, w_t: Weights,
               rnd: RoundInput) -> tuple[Weights, FedRelaxState]:
        """Store each reply's model (a client's last, if it replied twice: a flush under
        ``rounds=async``); rebuild the learned graph when due; under ``relax-server-step``
        step every other client toward its neighbours' mean (``server_steps``); w_{t+1} = the
        mean of all clients' current models (updated by the replies' and the steps' moves)."""
        assert self.models is not None and rnd.variant == "model"
        n = rnd.num_clients
        if rnd.server_round == 1:
            gr.check_ids(state.graph, n, self.params.graph)
        if rnd.server_round <= self.params.relax_warmup:
            return self.warm_update(state, w_t, rnd)
        version = gr.grown_rows(state.version[0], n)
        sketch = (gr.grown_rows(state.sketch[0], n) if self.params.graph == "knn"
                  else state.sketch[0])
        by_loss = self.params.graph == gl.SOURCE
        chosen = gl.grown_choice(state.chosen[0], n) if by_loss else state.chosen[0]
        measured = gr.grown_rows(state.measured[0], n) if by_loss else state.measured[0]
        pool = gr.grown_rows(state.pool[0], n) if by_loss else state.pool[0]
        probe = gr.grown_rows(state.probe[0], n)
        nearest = gr.grown_rows(state.nearest[0], n) if by_loss else state.nearest[0]
        remeasured = False
        moved = [np.zeros(a.shape, dtype=np.float64) for a in w_t]
        moves: dict[int, Weights] = {}
        # the groups the round's messages were built from (relax-train=groups)
        labels = self.groups(state, n) if self.params.grouped else None
        # relax-groups-by=loss: the groups after the round's choices, and the models chosen
        team = labels.copy() if labels is not None and self.params.choosing else None
        trained_from: dict[int, Weights] = {}
        # rounds=async: a client may reply twice before a flush; its later model replaces
        last = {u.partition_id: u for u in rnd.updates}
        for u in last.values():
            cid = u.partition_id
            if team is not None and labels is not None:
                group = self.chosen_group(state, u, labels)
                if group not in trained_from:
                    trained_from[group] = self.group_model(
                        state, int(np.flatnonzero(labels == group)[0]), labels)
                old = trained_from[group]
                team[cid] = group
            else:
                old = (self.group_model(state, cid, labels) if labels is not None
                       else self.model_of(state, cid))
            move = [new.astype(np.float64) - o.astype(np.float64)
                    for new, o in zip(u.upload, old, strict=True)]
            if labels is not None:  # its upload is its candidate model; group_steps store
                self.models.write(self.candidate_id(cid), rnd.server_round, u.upload,
                                  int(probe[cid]))
                probe[cid] = rnd.server_round
            else:
                # keep the file the last checkpoint names: the previous upload or the warm-up's
                self.models.write(cid, rnd.server_round, u.upload,
                                  int(version[cid]) if version[cid] > 0 else int(probe[cid]))
                version[cid] = rnd.server_round
                probe[cid] = 0  # scored by its own model from now on
                for acc, m in zip(moved, move, strict=True):
                    acc += m
            moves[cid] = move
            if self.params.graph == "knn":
                sketch[cid] = gr.sketch(move)
            if by_loss and team is None:  # under relax-groups-by=loss the losses chose a group
                remeasured |= self.record_losses(u, chosen, measured, pool, nearest,
                                                 rnd.server_round)
        graph = state.graph
        rebuild = self.params.graph == "knn" and (
            rnd.server_round == 1 or rnd.server_round % self.params.graph_refresh_every == 0)
        if rebuild:
            known = version > 0
            if self.params.relax_warmup:  # clients trained in the warm-up only: their moves
                known = known | np.any(sketch != 0.0, axis=1)
            graph = gr.knn_graph(sketch, known, self.params.graph_k)
        if remeasured:
            rebuild = True
            graph = gl.union_graph(chosen)
        if rebuild or rnd.server_round == 1:
            self.report(graph, n, rnd.server_round)
        if labels is not None:
            line: dict[str, object] = {"round": rnd.server_round, "groups": labels.tolist()}
            if team is not None:
                splits, cosines = self.split(team, last, moves)
                labels = team
                line = {"round": rnd.server_round, "groups": team.tolist(),
                        "cross-cosine": cosines, **({"splits": splits} if splits else {})}
            if self.results is not None:
                self.results.append_line(GROUPS_FILE, json.dumps(line))
            weight = {u.partition_id: float(w) for u, w in zip(rnd.updates, rnd.weights,
                                                               strict=True)}
            for acc, m in zip(moved, self.group_steps(state, labels, last, weight, version,
                                                      rnd.server_round), strict=True):
                acc += m
        if self.params.relax_server_step > 0:
            now = dataclasses.replace(state, version=[version], graph=graph, probe=[probe])
            for acc, m in zip(moved, self.server_steps(now, moves, n, rnd.server_round),
                              strict=True):
                acc += m
        w_next = [(w.astype(np.float64) + m / n).astype(w.dtype)
                  for w, m in zip(w_t, moved, strict=True)]
        return w_next, dataclasses.replace(
            state, version=[version], graph=graph, sketch=[sketch], chosen=[chosen],
            measured=[measured], pool=[pool],
            clock=[np.asarray([rnd.server_round], dtype=np.int64)], probe=[probe],
            nearest=[nearest], team=[team] if team is not None else state.team)

    def split(self, team: np.ndarray, replies: Mapping[int, ClientUpdate],
              moves: Mapping[int, Weights]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """CFL's split (Sattler et al. 2020; ``clustered.bipartition``) of each group (by id)
        with two or more replies in the round (their moves all from the group's model): the
        largest cosine between the two halves of the replies' moves, by group (returned), and
        where it is below ``relax-group-split``, the half without the round's lowest client id
        moves to a new group (``team`` in place; the next free id). Returns (the splits, the
        cosines)."""
        splits: list[dict[str, Any]] = []
        cosines: dict[str, float] = {}
        by_group: dict[int, list[int]] = {}
        for cid in sorted(replies):
            by_group.setdefault(int(team[cid]), []).append(cid)
        for group, ids in sorted(by_group.items()):
            if len(ids) < 2:
                continue
            flat = np.stack([np.concatenate([a.ravel() for a in moves[cid]]) for cid in ids])
            halves, cross = bipartition(flat)
            cosines[str(group)] = round(cross, 4)
            if cross >= self.params.relax_group_split:
                continue
            new = int(team.max()) + 1
            gone = [cid for cid, h in zip(ids, halves, strict=True) if h == 1]
            team[gone] = new
            splits.append({"from": group, "to": new, "cross-cosine": round(cross, 4),
                           "clients": gone})
        return splits, cosines

    def record_losses(self, u: ClientUpdate, chosen: np.ndarray, measured: np.ndarray,
                      pool: np.ndarray, nearest: np.ndarray, server_round: int) -> bool:
        """``graph=loss``: a reply's losses (they passed ``reply_problem``) become its choice,
        in place; whether it measured anything."""
        cid = u.partition_id
        sent = self.sent.get(cid, np.zeros(0, dtype=np.int64))
        if not len(sent):
            return False
        chosen[cid] = gl.choice(u.metrics, sent, self.params.graph_k)
        measured[cid] = server_round
        pool[cid] = len(sent)
        gl.fit_better(nearest, cid, u.metrics, sent)
        return True

    def group_steps(self, state: FedRelaxState, labels: np.ndarray,
                    replies: Mapping[int, ClientUpdate], weight: Mapping[int, float],
                    version: np.ndarray, server_round: int) -> Weights:
        """``relax-train=groups``: FedAvg within each group that has a reply, w_g <- sum_i
        n_i w_i / sum_i n_i over its members' uploads (``weight``: the round's weights,
        examples or 1), stored as every member's model, version ``server_round`` (``version``
        updated in place). Returns the sum of the members' moves (the global mean's)."""
        assert self.models is not None
        moved = [np.zeros(a.shape, dtype=np.float64) for a in state.w0]
        for label in sorted({int(labels[cid]) for cid in replies}):
            ids = [cid for cid in sorted(replies) if labels[cid] == label]
            mass = sum(weight[cid] for cid in ids)
            total = [np.zeros(a.shape, dtype=np.float64) for a in state.w0]
            for cid in ids:
                for acc, w in zip(total, replies[cid].upload, strict=True):
                    acc += weight[cid] * w.astype(np.float64)
            new = [(t / mass).astype(w.dtype) for t, w in zip(total, state.w0, strict=True)]
            for member in np.flatnonzero(labels == label):
                for acc, a, o in zip(moved, new, self.model_of(state, int(member)), strict=True):
                    acc += a.astype(np.float64) - o.astype(np.float64)
                self.models.write(int(member), server_round, new, int(version[member]))
                version[member] = server_round
        return moved

    def server_steps(self, state: FedRelaxState, replied: Mapping[int, Weights], n: int,
                     server_round: int) -> Weights:
        """``relax-server-step`` beta: every client not in ``replied`` with degree d_i > 0
        takes w^(i) <- (1 - beta) w^(i) + beta m_i, m_i from the models in ``state`` (all
        steps from the same models: Jacobi), stored as version ``server_round`` (``version``
        and ``probe`` are updated in place, as for an upload). Returns the sum of the moves."""
        assert self.models is not None
        beta = self.params.relax_server_step
        version, probe = state.version[0], state.probe[0]
        stepped: dict[int, tuple[Weights, Weights]] = {}  # client -> (its model, stepped)
        for cid in range(n):
            if cid in replied:
                continue
            if self.params.relax_server_rule == "moves":
                ids, weights = gr.neighbours(state.graph, cid)
                pairs = [(replied[int(j)], a) for j, a in zip(ids, weights, strict=True)
                         if int(j) in replied]
                if not pairs:
                    continue
                total = sum(a for _, a in pairs)
                own = self.model_of(state, cid)
                stepped[cid] = (own, [(w.astype(np.float64) + beta * sum(
                    a * m[k] for m, a in pairs) / total).astype(w.dtype)
                    for k, w in enumerate(own)])
                continue
            mean, degree = self.term(state, cid)
            if degree == 0.0:
                continue
            own = self.model_of(state, cid)
            stepped[cid] = (own, [(w.astype(np.float64) + beta * (
                m.astype(np.float64) - w.astype(np.float64))).astype(w.dtype)
                for w, m in zip(own, mean, strict=True)])
        moved = [np.zeros(a.shape, dtype=np.float64) for a in state.w0]
        for cid, (own, new) in stepped.items():  # each model read once, above
            for acc, a, o in zip(moved, new, own, strict=True):
                acc += a.astype(np.float64) - o.astype(np.float64)
            self.models.write(cid, server_round, new,
                              int(version[cid]) if version[cid] > 0 else int(probe[cid]))
            version[cid] = server_round
            probe[cid] = 0
        return moved

    def warm_update(self, state: FedRelaxState, w_t: Weights,
                    rnd: RoundInput) -> tuple[Weights, FedRelaxState]:
        """A warm-up round: FedAvg's step w_t + eta_g D on the shared model; no client model
        is stored. After the last one its model becomes every client's w^(i) (``w0``), and
        the knn graph is built from the warm-up's moves (each from the shared model). Under
        ``graph=loss`` each reply's upload (w_iK, trained from the shared model on the
        client's data only) is kept as that client's candidate model (``probe``), so the first
        measurements, in round R+1, score every client the warm-up trained."""
        assert self.models is not None
        n = rnd.num_clients
        w_next = apply_step(w_t, rnd.aggregate, rnd.server_lr)
        probe = state.probe[0]
        chosen, measured = state.chosen[0], state.measured[0]
        pool, nearest = state.pool[0], state.nearest[0]
        remeasured = False
        if self.measures_in_warmup:
            chosen, measured = gl.grown_choice(chosen, n), gr.grown_rows(measured, n)
            pool, nearest = gr.grown_rows(pool, n), gr.grown_rows(nearest, n)
            for u in rnd.updates:
                remeasured |= self.record_losses(u, chosen, measured, pool, nearest,
                                                 rnd.server_round)
        if self.params.graph == gl.SOURCE or self.params.choosing:  # choosing: who uploaded
            probe = gr.grown_rows(probe, n)
            for u in rnd.updates:
                cid = u.partition_id
                self.models.write(self.candidate_id(cid), rnd.server_round, u.upload,
                                  int(probe[cid]))
                probe[cid] = rnd.server_round
        sketch = state.sketch[0]
        if self.params.graph == "knn":
            sketch = gr.grown_rows(sketch, n)
            for u in rnd.updates:
                sketch[u.partition_id] = gr.sketch(
                    [new.astype(np.float64) - w.astype(np.float64)
                     for new, w in zip(u.upload, w_t, strict=True)])
        last = rnd.server_round == self.params.relax_warmup
        graph = state.graph
        if last and self.params.graph == "knn":
            graph = gr.knn_graph(sketch, np.any(sketch != 0.0, axis=1), self.params.graph_k)
        if remeasured:
            graph = gl.union_graph(chosen)
        if last or rnd.server_round == 1 or remeasured:
            self.report(graph, n, rnd.server_round)
        after = dataclasses.replace(
            state, w0=[a.copy() for a in w_next] if last else state.w0, graph=graph,
            sketch=[sketch], clock=[np.asarray([rnd.server_round], dtype=np.int64)],
            probe=[probe], chosen=[chosen], measured=[measured], pool=[pool],
            nearest=[nearest])
        if last and self.params.choosing:  # the graph's groups seed the membership
            labels = self.groups(after, n)
            if self.params.graph == gl.SOURCE:  # a pooled client: its nearest's group
                labels = gg.placed(labels, gr.grown_rows(nearest, n))
            team = gg.numbered(labels)
            after = dataclasses.replace(after, team=[team])
            if self.results is not None:
                self.results.append_line(GROUPS_FILE, json.dumps(
                    {"round": rnd.server_round, "groups": team.tolist(), "seeded": True}))
        return w_next, after

    def report(self, graph: list[np.ndarray], n: int, server_round: int) -> None:
        """``graph.json`` (the edge list in use, from which round) and ``graph.png``."""
        if self.results is None:
            return
        text = json.dumps({"round": server_round, "source": self.params.graph,
                           "num-clients": n, "edges": gr.as_json(graph)})
        self.results.replace_text(GRAPH_FILE, text)
        if n <= DRAW_LIMIT:
            self.results.draw_graph(GRAPH_PNG, graph, n, f"FedRelax graph "
                                    f"({self.params.graph}) after round {server_round}")


class FedRelaxClient(ClientRule[FedRelaxParams]):
    """Local SGD on L_i(w) + alpha d_i ||w - m_i||^2 from the client's own model."""

    state_keys = (OWN,)
    down_keys = (DEGREE, WARMUP, START, gl.CANDIDATES, gl.CANDIDATE_IDS, GROUP)
    personal_key = OWN

    def initial_state(self, key: str, w_t: Weights) -> Weights:
        """w^(i) starts from the first term the client receives (w_0 in round 1)."""
        return [a.copy() for a in w_t] if key == OWN else super().initial_state(key, w_t)

    def train(self, job: LocalJob) -> LocalOutcome:
        if float(np.asarray(job.down[WARMUP][0]).reshape(-1)[0]) != 0.0:
            # a warm-up round: FedAvg's pass on the shared model; w^(i) is not started yet
            # (relax-train=groups: the candidates' losses are measured first, as after it)
            metrics = self.measure(job)
            return LocalOutcome(job.sgd(job.w_t), {}, {}, metrics)
        warm = unstacked(job.down[START])
        own = warm[0] if warm else job.state[OWN]
        group = np.asarray(job.down[GROUP][0]).reshape(-1)
        metrics = self.measure(job)
        if len(group):  # relax-groups-by=loss: IFCA's choice among the groups' models
            ids = np.asarray(job.down[gl.CANDIDATE_IDS][0]).reshape(-1)
            pick = gg.joined(metrics, ids, int(group[0]), self.params.relax_group_margin)
            own = unstacked(job.down[gl.CANDIDATES])[pick]
        degree = float(np.asarray(job.down[DEGREE][0]).reshape(-1)[0])
        strength = 2.0 * self.params.fedrelax_alpha * degree
        if job.lr * strength >= 2.0:
            raise ValueError(f"fedrelax-alpha={self.params.fedrelax_alpha!r} with degree "
                             f"{degree:g} at lr={job.lr!r}: lr x 2 alpha d_i = "
                             f"{job.lr * strength:g} >= 2 diverges; lower fedrelax-alpha")
        trained = job.sgd(own, proximal_hook(job.w_t, strength, job.device))
        return LocalOutcome(trained, {OWN: trained.final}, {}, metrics)

    @staticmethod
    def measure(job: LocalJob) -> dict[str, Scalar]:
        """``graph=loss``: the mean loss of each candidate model sent on this client's own
        training data, by candidate (nothing when none was sent)."""
        ids = np.asarray(job.down[gl.CANDIDATE_IDS][0]).reshape(-1)
        if len(ids) == 0:
            return {}
        if job.losses is None:
            raise ValueError("FedRelax with graph=loss needs the client's training losses "
                             "(LocalJob.losses); this client shell gives none")
        models = unstacked(job.down[gl.CANDIDATES])
        if len(models) != len(ids):
            raise ValueError(f"the server sent {len(models)} candidate models for "
                             f"{len(ids)} candidate ids")
        return {gl.loss_key(int(j)): float(v)
                for j, v in zip(ids, job.losses(models), strict=True)}


SPEC = MethodSpec(name="fedrelax", label="FedRelax", params=FedRelaxParams,
                  server=FedRelaxServer, client=FedRelaxClient, ri_aggregation="model",
                  async_refusal=None,
                  secagg_refusal=("the server keeps each client's own model, which needs "
                                  "each upload"))
