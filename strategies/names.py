"""Method names accepted by the run config (kept free of imports so config can use it)."""

METHOD_NAMES: tuple[str, ...] = ("fedavg",)
RI_AGGREGATIONS: tuple[str, ...] = ("model", "update")
WEIGHTINGS: tuple[str, ...] = ("examples", "uniform")
