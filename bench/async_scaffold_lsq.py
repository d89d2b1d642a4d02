"""How fast asynchronous SCAFFOLD (``rounds=async``) reaches the least-squares optimum.

The problem of tests/test_methods_lsq.py (8 heterogeneous clients, K = 10 full-batch steps,
lr 0.1), run through the real FedBuff loop and client code (``testbeds/lsq_async.py``) with
every client always busy (concurrency 8) and ``buffer-size`` 4, so every reply after the
first flush is at least one version stale. Replies come in the order the clients' speeds
give (equal, or 1 to 5x spread evenly: the virtual clock's order). One JSON line per run: the
relative error ||w - w*|| / ||w*|| after ``--flushes`` flushes, and, for reference, sync
SCAFFOLD's after the same number of client updates (all 8 clients a round).

  python -m bench.async_scaffold_lsq                 # 100 flushes, 8 runs (~4 min on 1 core)
  python -m bench.async_scaffold_lsq --flushes 40
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from fedinit.config import RunConfig
from testbeds.lsq_async import run_lsq_async, speed_order
from testbeds.lsq_problem import Federation, lsq_optimum, lsq_problem

N, BUFFER = 8, 4
LOCAL: dict[str, Any] = {
    "num-clients": N, "lr": 0.1, "local-epochs": 10, "batch-size": 1000, "weighting": "uniform",
    "weight-decay": 0.0, "clip-norm": 0.0, "lr-decay": 1.0, "beta": 0.0,
    "max-update-norm-ratio": 0.0, "personal-eval-every": 0, "output-dir": "/tmp/unused",
    "method": "scaffold"}
"""As tests/test_methods_lsq.py: no RI, decay, clipping or norm filter."""
SPEEDS = {"equal": [1.0] * N, "1-5x": [1.0 + 4.0 * i / (N - 1) for i in range(N)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flushes", type=int, default=100)
    args = ap.parse_args()
    p = lsq_problem(num_clients=N, dim=5, n=20, seed=0)
    opt = lsq_optimum(p)

    def error(w: np.ndarray) -> float:
        return float(np.linalg.norm(w - opt) / np.linalg.norm(opt))

    sync = Federation(p, {**LOCAL, "fraction-train": 1.0})
    sync_err = error(sync.run(args.flushes * BUFFER // N))
    for name, speeds in SPEEDS.items():
        for staleness in ("constant", "poly"):
            for server_lr in (1.0, 0.5):
                cfg = RunConfig.parse({
                    **LOCAL, "rounds": "async", "concurrency": N, "buffer-size": BUFFER,
                    "num-server-rounds": args.flushes, "staleness": staleness,
                    "staleness-a": 0.5, "server-lr": server_lr})
                script = speed_order(speeds, BUFFER * args.flushes + 4 * N)
                with tempfile.TemporaryDirectory() as root:
                    w, *_ = run_lsq_async(p, cfg, script, Path(root))
                print(json.dumps({"speeds": name, "staleness": staleness,
                                  "server-lr": server_lr, "flushes": args.flushes,
                                  "rel-error": error(w), "sync-rel-error": sync_err}),
                      flush=True)


if __name__ == "__main__":
    main()
