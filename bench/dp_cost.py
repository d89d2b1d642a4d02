"""The cost of client-level DP (seconds per round, bytes) beside the same run without it.

    .venv/bin/python -m bench.dp_cost                       # FedInit, 10 clients, 5 per round
    .venv/bin/python -m bench.dp_cost method=scaffold --rounds 4

Runs the same experiment in-process (the real round loop and ClientApp handlers,
``fedinit/cli/inprocess_grid.py``) with ``dp`` = off, central and local, each with
``weighting=uniform`` and ``ri-aggregation=update`` (what DP requires, so only DP differs),
and prints per run: mean round seconds (round 1, data loading, left out), of it the server's
``aggregate_train`` and the accountant, the bytes of one reply and one train message as
Flower serializes them, final accuracy and epsilon.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.cost_runs import cost_args, cost_run
from fedinit.config import RunConfig
from fedinit.methods import dp_budget
from strategies import method_strategy as strategy_module
from testbeds.lsq_problem import serialized_bytes

BASE: dict[str, Any] = {"num-clients": 10, "fraction-train": 0.5, "train-limit": 5000,
                        "local-epochs": 1, "beta": 0.1, "weighting": "uniform",
                        "ri-aggregation": "update", "dp-clip": 1.0,
                        "dp-noise-multiplier": 0.5, "eval-every": 1000}


def one_run(raw: dict[str, Any]) -> dict[str, Any]:
    run = cost_run(raw, {"agg": (strategy_module.MethodStrategy, "aggregate_train"),
                         "acct": (dp_budget.Budget, "epsilon")})
    rows = run.rows
    trains = [m for m in run.grid.sent if m.metadata.message_type == "train"]
    replies = [r for r in run.grid.replies if r.metadata.message_type == "train"]
    later = [r["round-seconds"] for r in rows[1:]] or [rows[0]["round-seconds"]]
    return {"dp": run.cfg.privacy.dp, "round-s": statistics.mean(later),
            "agg-s": run.seconds["agg"] / len(rows), "acct-s": run.seconds["acct"] / len(rows),
            "up": serialized_bytes(replies[-1].content),
            "down": serialized_bytes(trains[-1].content), "acc": run.summary["final-test-acc"],
            "eps": run.summary.get("dp-epsilon")}


def main(argv: list[str] | None = None) -> int:
    rounds, overrides = cost_args(__doc__, 5, argv)
    raw = {**BASE, "num-server-rounds": rounds, **overrides}
    results = [one_run({**raw, "dp": mode}) for mode in ("off", "central", "local")]
    cfg = RunConfig.parse({**raw, "output-dir": "/tmp/unused"})
    print(f"\n{cfg.method} beta={cfg.train.beta}, {cfg.num_clients} clients, "
          f"{cfg.clients_per_round} per round, {rounds} rounds, "
          f"train-limit={cfg.data.train_limit}, dp-clip={cfg.privacy.dp_clip}, "
          f"dp-noise-multiplier={cfg.privacy.dp_noise_multiplier}, "
          f"dp-delta={cfg.privacy.dp_delta:g}")
    print(f"{'dp':<8} {'round s':>8} {'aggregate s':>11} {'accountant s':>12} "
          f"{'reply bytes':>12} {'train msg bytes':>15} {'final acc':>9} {'epsilon':>8}")
    for r in results:
        eps = "-" if r["eps"] is None else f"{r['eps']:.3g}"
        print(f"{r['dp']:<8} {r['round-s']:>8.2f} {r['agg-s']:>11.3f} {r['acct-s']:>12.3f} "
              f"{r['up']:>12,} {r['down']:>15,} {100 * r['acc']:>8.2f}% {eps:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
