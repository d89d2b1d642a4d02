"""The cost of client-level DP (seconds per round, bytes) beside the same run without it.

    .venv/bin/python -m bench.dp_cost                       # FedInit, 10 clients, 5 per round
    .venv/bin/python -m bench.dp_cost method=scaffold --rounds 4

Runs the same experiment in-process (the real round loop and ClientApp handlers,
``scripts/inprocess_grid.py``) with ``dp`` = off, central and local, each with
``weighting=uniform`` and ``ri-aggregation=update`` (what DP requires, so only DP differs),
and prints per run: mean round seconds (round 1, data loading, left out), of it the server's
``aggregate_train`` and the accountant, the bytes of one reply and one train message as
Flower serializes them, final accuracy and epsilon.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from methods import dp_budget
from scripts.inprocess_grid import InProcessGrid
from scripts.simulate import parse_overrides
from server_app import strategy as strategy_module
from server_app.experiment import run_experiment
from task.config import RunConfig
from testbeds.lsq_problem import serialized_bytes

BASE: dict[str, Any] = {"num-clients": 10, "fraction-train": 0.5, "train-limit": 5000,
                        "local-epochs": 1, "beta": 0.1, "weighting": "uniform",
                        "ri-aggregation": "update", "dp-clip": 1.0,
                        "dp-noise-multiplier": 0.5, "eval-every": 1000}


class Timed:
    """Adds up the wall time of one function while the run uses it (patched in place)."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name, self.seconds = owner, name, 0.0
        self.inner = getattr(owner, name)

    def __enter__(self) -> Timed:
        inner = self.inner

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        setattr(self.owner, self.name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self.owner, self.name, self.inner)


def one_run(raw: dict[str, Any]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        raw = {**raw, "output-dir": tmp}
        cfg = RunConfig.parse(raw)
        grid = InProcessGrid(cfg.num_clients, raw)
        with (Timed(strategy_module.MethodStrategy, "aggregate_train") as agg,
              Timed(dp_budget.Budget, "epsilon") as acct):
            summary = run_experiment(grid, cfg, Path(tmp) / "run")
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "rounds.jsonl").open()]
    trains = [m for m in grid.sent if m.metadata.message_type == "train"]
    replies = [r for r in grid.replies if r.metadata.message_type == "train"]
    later = [r["round-seconds"] for r in rows[1:]] or [rows[0]["round-seconds"]]
    return {"dp": cfg.dp, "round-s": statistics.mean(later), "agg-s": agg.seconds / len(rows),
            "acct-s": acct.seconds / len(rows), "up": serialized_bytes(replies[-1].content),
            "down": serialized_bytes(trains[-1].content), "acc": summary["final-test-acc"],
            "eps": summary.get("dp-epsilon")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    raw = {**BASE, "num-server-rounds": args.rounds, **parse_overrides(args.overrides)}
    results = [one_run({**raw, "dp": mode}) for mode in ("off", "central", "local")]
    cfg = RunConfig.parse({**raw, "output-dir": "/tmp/unused"})
    print(f"\n{cfg.method} beta={cfg.beta}, {cfg.num_clients} clients, {cfg.clients_per_round}"
          f" per round, {args.rounds} rounds, train-limit={cfg.train_limit}, dp-clip="
          f"{cfg.dp_clip}, dp-noise-multiplier={cfg.dp_noise_multiplier}, dp-delta="
          f"{cfg.dp_delta:g}")
    print(f"{'dp':<8} {'round s':>8} {'aggregate s':>11} {'accountant s':>12} "
          f"{'reply bytes':>12} {'train msg bytes':>15} {'final acc':>9} {'epsilon':>8}")
    for r in results:
        eps = "-" if r["eps"] is None else f"{r['eps']:.3g}"
        print(f"{r['dp']:<8} {r['round-s']:>8.2f} {r['agg-s']:>11.3f} {r['acct-s']:>12.3f} "
              f"{r['up']:>12,} {r['down']:>15,} {100 * r['acc']:>8.2f}% {eps:>8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
