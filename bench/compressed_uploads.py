"""Bytes up and accuracy with compressed uploads (issue 44, item 3): the default CNN and data
set, in process (``cli.inprocess_grid``, the real ClientApp), one run per codec with the same
seed; ``bytes-up`` summed from the rows (the encoded payload of the aggregated replies).

    .venv/bin/python -m bench.compressed_uploads [--rounds 5] [--clients 10] \
        [--codecs off,q8,topk:0.01+q8] [--method fedavg] [--train-limit 3000]

A short run, not the issue's benchmark (the default experiment, 3 paired seeds): the
accuracies after a few rounds say the codecs train alike, not their final gap.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from cli.inprocess_grid import InProcessGrid
from cli.run_dirs import read_rows
from methods import wire as rk
from server_app.experiment import run_experiment
from task.config import RunConfig


def one_run(raw: dict[str, Any], out: Path) -> dict[str, float]:
    """Total bytes up, replies, final accuracy and seconds of one in-process run."""
    cfg = RunConfig.parse({**raw, "output-dir": str(out)})
    t0 = time.perf_counter()
    run_experiment(InProcessGrid(cfg.num_clients, raw), cfg, out_dir=out / "run")
    rows = read_rows(out / "run" / "rounds.jsonl")
    return {"bytes-up": float(sum(r[rk.BYTES_UP] for r in rows)),
            "replies": float(sum(r[rk.NUM_REPLIES] for r in rows)),
            "test-acc": float(rows[-1]["test-acc"]), "seconds": time.perf_counter() - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--train-limit", type=int, default=3000)
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--codecs", default="off,q8,topk:0.01+q8")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    base = {"method": args.method, "num-server-rounds": args.rounds,
            "num-clients": args.clients, "fraction-train": args.fraction,
            "train-limit": args.train_limit, "eval-every": args.rounds,
            "personal-eval-every": 0, "seed": args.seed}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for codec in args.codecs.split(","):
            results[codec] = one_run({**base, "compression": codec}, Path(tmp) / f"c{len(results)}")
    plain = results.get("off")
    print(f"{'compression':<14} {'bytes-up/reply':>15} {'x fewer':>8} {'test-acc':>9} {'s':>6}")
    for codec, r in results.items():
        per = r["bytes-up"] / max(r["replies"], 1.0)
        fewer = (plain["bytes-up"] / plain["replies"]) / per if plain and per else float("nan")
        print(f"{codec:<14} {per:>15,.0f} {fewer:>8.2f} {100 * r['test-acc']:>8.2f}% "
              f"{r['seconds']:>6.1f}")


if __name__ == "__main__":
    main()
