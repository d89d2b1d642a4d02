"""Method names accepted by the run config (kept free of imports so config can use it)."""

METHOD_NAMES: tuple[str, ...] = (
    "fedavg", "fedprox", "fedadam", "scaffold", "feddyn", "fedcm", "fedsam",
)
RI_AGGREGATIONS: tuple[str, ...] = ("model", "update")
WEIGHTINGS: tuple[str, ...] = ("examples", "uniform")
AGGREGATIONS: tuple[str, ...] = ("mean", "median", "trimmed-mean")
