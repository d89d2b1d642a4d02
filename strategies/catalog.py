"""One Flower ``Strategy`` class per method, constructed like Flower's own.

Each class only names its method (``fedinit.methods.registry``) and maps its own arguments to the
method's run-config keys; everything else is ``MethodAdapter``'s (``strategies/base.py``),
and the rules are the method's module in ``fedinit/methods/``. Every class takes the shared
settings of ``MethodAdapter`` as keywords (``fraction_train``, ``min_train_nodes``,
``min_available_nodes``, ``fraction_evaluate``, ``lr``, ...). The RI coefficient ``beta``
is FedInit's relaxed start, s_i = w_t + beta (w_t - w_prev_i), and composes with every
method but FedRelax and clustered FL. ``-1 < beta < 1``: a negative beta (a start pulled
towards the client's last model) is allowed because the paper's own ablation (its Figure 1b)
runs beta = -0.1 and -0.2; it lowers accuracy there and here (docs/reproduction.md).
"""

from __future__ import annotations

from typing import Any

from strategies.base import MethodAdapter

Own = dict[str, tuple[str, Any]]
"""A method's arguments: {argument: (run-config key, value)}."""


def _ri(beta: float, ri_aggregation: str) -> Own:
    return {"beta": ("beta", beta), "ri_aggregation": ("ri-aggregation", ri_aggregation)}


class FedAvg(MethodAdapter):
    """FedAvg: w_{t+1} = w_t + server_lr * avg(Delta_i) (with RI when beta != 0)."""

    method = "fedavg"

    def __init__(self, *, beta: float = 0.0, ri_aggregation: str = "auto",
                 **settings: Any) -> None:
        super().__init__(_ri(beta, ri_aggregation), **settings)


class FedInit(FedAvg):
    """FedInit: FedAvg whose clients start from the relaxed point (beta = 0.1 by default)."""

    def __init__(self, *, beta: float = 0.1, ri_aggregation: str = "auto",
                 **settings: Any) -> None:
        super().__init__(beta=beta, ri_aggregation=ri_aggregation, **settings)


class FedProx(MethodAdapter):
    """FedProx: the local objective adds (proximal_mu / 2) ||w - s_i||^2 (Flower's FedProx
    names the coefficient ``proximal_mu`` too)."""

    method = "fedprox"

    def __init__(self, *, proximal_mu: float = 0.1, beta: float = 0.0,
                 ri_aggregation: str = "auto", **settings: Any) -> None:
        super().__init__({"proximal_mu": ("prox-mu", proximal_mu), **_ri(beta, ri_aggregation)},
                         **settings)


class FedAdam(MethodAdapter):
    """FedAdam: server Adam on avg(Delta_i), no bias correction; server_lr 0 means 0.1."""

    method = "fedadam"

    def __init__(self, *, beta1: float = 0.9, beta2: float = 0.99, eps: float = 0.01,
                 beta: float = 0.0, ri_aggregation: str = "auto", **settings: Any) -> None:
        super().__init__({"beta1": ("adam-beta1", beta1), "beta2": ("adam-beta2", beta2),
                          "eps": ("adam-eps", eps), **_ri(beta, ri_aggregation)}, **settings)


class Scaffold(MethodAdapter):
    """SCAFFOLD (option II): control variates c (server) and c_i (each client)."""

    method = "scaffold"

    def __init__(self, *, beta: float = 0.0, ri_aggregation: str = "auto",
                 **settings: Any) -> None:
        super().__init__(_ri(beta, ri_aggregation), **settings)


class FedDyn(MethodAdapter):
    """FedDyn: dynamic regularisation with weight alpha; the client keeps h_i."""

    method = "feddyn"

    def __init__(self, *, alpha: float = 0.1, beta: float = 0.0, ri_aggregation: str = "auto",
                 **settings: Any) -> None:
        super().__init__({"alpha": ("feddyn-alpha", alpha), **_ri(beta, ri_aggregation)},
                         **settings)


class FedCM(MethodAdapter):
    """FedCM: local steps along alpha * grad + (1 - alpha) * the server's momentum."""

    method = "fedcm"

    def __init__(self, *, alpha: float = 0.1, beta: float = 0.0, ri_aggregation: str = "auto",
                 **settings: Any) -> None:
        super().__init__({"alpha": ("fedcm-alpha", alpha), **_ri(beta, ri_aggregation)},
                         **settings)


class FedSAM(MethodAdapter):
    """FedSAM: clients train with SAM of radius rho."""

    method = "fedsam"

    def __init__(self, *, rho: float = 0.1, beta: float = 0.0, ri_aggregation: str = "auto",
                 **settings: Any) -> None:
        super().__init__({"rho": ("sam-rho", rho), **_ri(beta, ri_aggregation)}, **settings)


class Ditto(MethodAdapter):
    """Ditto: each client also trains a personal model v_i pulled to w_t by lambda_."""

    method = "ditto"

    def __init__(self, *, lambda_: float = 0.1, beta: float = 0.0,
                 ri_aggregation: str = "auto", **settings: Any) -> None:
        super().__init__({"lambda_": ("ditto-lambda", lambda_), **_ri(beta, ri_aggregation)},
                         **settings)


class FedRelax(MethodAdapter):
    """FedRelax (GTVMin): each client trains its own model, pulled to its graph neighbours'."""

    method = "fedrelax"

    def __init__(self, *, alpha: float = 0.1, graph: str = "knn", graph_k: int = 3,
                 graph_refresh_every: int = 5, graph_candidates: int = 32,
                 relax_warmup: int = 0, relax_server_step: float = 0.0,
                 relax_server_rule: str = "mean", relax_serve: str = "mean",
                 relax_train: str = "gtv", relax_groups_by: str = "graph",
                 relax_group_margin: float = 0.1, relax_group_split: float = -1.0,
                 **settings: Any) -> None:
        """``relax_server_step``, ``relax_server_rule``: the server's neighbourhood step for
        the clients that did not train in a round (docs/algorithms.md, FedRelax);
        ``relax_serve``: the model personalized evaluation serves each client;
        ``relax_train``: each client's own model (``gtv``) or one per graph group;
        ``relax_groups_by``, ``relax_group_margin``, ``relax_group_split``: under ``groups``,
        the graph's groups or seeded by them and moved by the clients' losses (IFCA), the
        member's margin, CFL's split."""
        super().__init__({"alpha": ("fedrelax-alpha", alpha), "graph": ("graph", graph),
                          "graph_k": ("graph-k", graph_k),
                          "graph_refresh_every": ("graph-refresh-every", graph_refresh_every),
                          "graph_candidates": ("graph-candidates", graph_candidates),
                          "relax_warmup": ("relax-warmup", relax_warmup),
                          "relax_server_step": ("relax-server-step", relax_server_step),
                          "relax_server_rule": ("relax-server-rule", relax_server_rule),
                          "relax_serve": ("relax-serve", relax_serve),
                          "relax_train": ("relax-train", relax_train),
                          "relax_groups_by": ("relax-groups-by", relax_groups_by),
                          "relax_group_margin": ("relax-group-margin", relax_group_margin),
                          "relax_group_split": ("relax-group-split", relax_group_split),
                          "beta": ("beta", 0.0)}, **settings)


class ClusteredFL(MethodAdapter):
    """Clustered FL, one model per cluster: each client picks the cluster model with the
    lowest loss on its own data (``cluster_assign="loss"``), or k-means of the clients'
    updates (``"kmeans"``)."""

    method = "clustered"

    def __init__(self, *, num_clusters: int = 2, cluster_every: int = 5,
                 cluster_assign: str = "loss", cluster_warmup: int = 3,
                 cluster_margin: float = 0.1, cluster_newcomer: str = "probe",
                 cluster_split: float = -1.0, cluster_serve: str = "assigned",
                 **settings: Any) -> None:
        super().__init__({"num_clusters": ("num-clusters", num_clusters),
                          "cluster_every": ("cluster-every", cluster_every),
                          "cluster_assign": ("cluster-assign", cluster_assign),
                          "cluster_warmup": ("cluster-warmup", cluster_warmup),
                          "cluster_margin": ("cluster-margin", cluster_margin),
                          "cluster_newcomer": ("cluster-newcomer", cluster_newcomer),
                          "cluster_split": ("cluster-split", cluster_split),
                          "cluster_serve": ("cluster-serve", cluster_serve),
                          "beta": ("beta", 0.0)}, **settings)


STRATEGIES: tuple[type[MethodAdapter], ...] = (
    FedAvg, FedInit, FedProx, FedAdam, Scaffold, FedDyn, FedCM, FedSAM, Ditto, FedRelax,
    ClusteredFL)
"""Every class; each registry method has one (FedInit is FedAvg's with beta = 0.1)."""
