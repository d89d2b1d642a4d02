"""Method names accepted by the run config (kept free of imports so config can use it)."""

METHOD_NAMES: tuple[str, ...] = (
    "fedavg", "fedprox", "fedadam", "scaffold", "feddyn", "fedcm", "fedsam",
)
RI_AGGREGATIONS: tuple[str, ...] = ("auto", "model", "update")
RI_AGGREGATION_AUTO: dict[str, str] = {
    "fedavg": "model", "fedprox": "model", "fedsam": "model", "scaffold": "model",
    "fedadam": "update", "fedcm": "update", "feddyn": "update",
}
"""What ``ri-aggregation=auto`` means per method. ``model`` is Algorithm 1 (FedInit). The
methods whose server state is built from the aggregate update D (Adam's moments, FedCM's
momentum, FedDyn's H) get ``update``: under ``model`` the RI offset beta (w_t - w_prev_i) enters
D, that state replays it into the next rounds, and the loop gains > 1 (measured: FedAdam + RI
-18/-20 points, FedCM + RI to chance; docs/reproduction.md)."""
WEIGHTINGS: tuple[str, ...] = ("examples", "uniform")
AGGREGATIONS: tuple[str, ...] = ("mean", "median", "trimmed-mean")
SERVER_LR_AUTO: dict[str, float] = {"fedadam": 0.1}
"""What ``server-lr=0`` (the default) means per method: the paper's eta_g, 0.1 for FedAdam (whose
Adam step is about eta_g per coordinate), 1 for every other method."""
