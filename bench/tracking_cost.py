"""What TensorBoard tracking costs per round, beside the same run without it.

    .venv/bin/python -m bench.tracking_cost                                  # 10 clients a round
    .venv/bin/python -m bench.tracking_cost num-clients=400 train-limit=8000  # 200 a round

Runs the same experiment in-process (the real round loop and ClientApp handlers,
``fedinit/cli/inprocess_grid.py``) with ``tracking`` = off, then tensorboard, personalized
evaluation every round (so the per-client histograms are written too), and prints per run the
mean round seconds and the seconds a round spends in the Recorder (the rows, and with tracking
their event files), then the difference as a share of the round. The tracker's one-time start
(importing TensorBoard's writer, the hyperparameters) is printed apart: it is paid once a run.
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.cost_runs import cost_args, cost_run
from server_app import tracking
from server_app.results import Recorder

BASE: dict[str, Any] = {"num-clients": 20, "fraction-train": 0.5, "train-limit": 4000,
                        "local-epochs": 1, "beta": 0.1, "eval-every": 1,
                        "personal-eval-every": 1, "local-test-fraction": 0.2}


def one_run(raw: dict[str, Any]) -> dict[str, Any]:
    run = cost_run(raw, {"rows": (Recorder, "add_round"),
                         "clients": (Recorder, "write_personal_clients"),
                         "start": (tracking.TensorBoardTracker, "__init__")})
    n = len(run.rows)
    later = [r["round-seconds"] for r in run.rows[1:]] or [0.0]
    return {"tracking": run.cfg.fleet.tracking, "per-round": run.cfg.clients_per_round,
            "round-s": statistics.mean(later),
            "record-s": (run.seconds["rows"] + run.seconds["clients"]) / n,
            "start-s": run.seconds["start"]}


def main(argv: list[str] | None = None) -> int:
    rounds, overrides = cost_args(__doc__, 4, argv)
    raw = {**BASE, "num-server-rounds": rounds, **overrides}
    off, on = (one_run({**raw, "tracking": mode}) for mode in ("off", "tensorboard"))
    print(f"\n{on['per-round']} clients a round, {rounds} rounds (round 1 left out of the "
          "round time)")
    print(f"{'tracking':<12} {'round s':>8} {'recorder s/round':>17} {'start s':>8}")
    for r in (off, on):
        print(f"{r['tracking']:<12} {r['round-s']:>8.3f} {r['record-s']:>17.4f} "
              f"{r['start-s']:>8.3f}")
    extra = on["record-s"] - off["record-s"]
    print(f"tracking adds {extra * 1000:.2f} ms a round = {100 * extra / off['round-s']:.2f}% "
          f"of the round without it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
