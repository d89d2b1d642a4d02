"""Server memory and disk against the number of clients: FedRelax beside FedAvg and clustered FL.

The real ``MethodStrategy`` (configure_train, reply checks, aggregate_train, the method's
server rule, its files) with the default CNN's shape; each sampled client answers with the
model it received plus seeded noise (what the server does with an upload does not depend on
how it was trained, so no training is run). For each N: ``--rounds`` rounds of
``--per-round`` clients, the learned graph rebuilt every round (FedRelax's worst case).
Measured: the server's peak Python heap during the rounds (tracemalloc: numpy arrays
included), its server-state bytes (what the checkpoint holds), the disk of its per-client
copies after the rounds (and projected for all N clients having trained: 2 versions each at
most), its seconds per round, and the bytes per client per round down and up (Flower's
serialized object tree).

    .venv/bin/python -m bench.fedrelax_scale [--clients 100 1000 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.config import RunConfig
from fedinit.methods import clustered
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.task.models import get_weights, initial_model
from strategies.method_strategy import SERVER_MODELS, MethodStrategy
from testbeds.lsq_problem import serialized_bytes

METHODS = {"fedavg": {"beta": 0.0},
           "fedrelax": {"beta": 0.0, "graph": "knn", "graph-k": 3, "graph-refresh-every": 1},
           "clustered": {"beta": 0.0, "num-clusters": 4, "cluster-every": 1}}


def reply(msg: Message, rng: np.random.Generator) -> Message:
    """A plausible upload: the received model moved by small seeded noise."""
    got = unpack(msg.content.array_records[rk.ARRAYS])
    up = [(a + 1e-3 * rng.standard_normal(a.shape)).astype(a.dtype) for a in got]
    metrics = MetricRecord({rk.NUM_EXAMPLES: 100, rk.TRAIN_LOSS: 1.0, rk.NUM_STEPS: 8})
    if clustered.CURRENT in msg.content.array_records:  # cluster-assign=loss: keep the cluster sent
        current = unpack(msg.content.array_records[clustered.CURRENT])[0]
        metrics[clustered.CHOICE] = int(np.asarray(current).reshape(-1)[0])
    return Message(content=RecordDict({rk.ARRAYS: ArrayRecord(up), rk.METRICS: metrics,
                                       rk.CONFIG: ConfigRecord({rk.UPLOAD_DELTA: False})}),
                   reply_to=msg)


def measure(method: str, n: int, per_round: int, rounds: int) -> dict[str, Any]:
    """One method at N clients: memory, disk, time, bytes (see the module docstring)."""
    set_task_identity()
    run_dir = Path(tempfile.mkdtemp(prefix=f"scale-{method}-{n}-"))
    raw = {"method": method, "num-clients": n, "fraction-train": per_round / n,
           "max-update-norm-ratio": 0.0, "output-dir": str(run_dir), **METHODS[method]}
    cfg = RunConfig.parse(raw)
    w0 = get_weights(initial_model(cfg))
    model_bytes = sum(a.nbytes for a in w0)
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    strategy = MethodStrategy(cfg, {p: 1000 + p for p in range(n)}, w0, examples=None)
    strategy.bind_run_dir(run_dir)
    arrays = ArrayRecord(w0)
    rng = np.random.default_rng(0)
    seconds, down, up = [], 0, 0
    for rnd in range(1, rounds + 1):
        t0 = time.perf_counter()
        messages = list(strategy.configure_train(rnd, arrays, ConfigRecord(), None))  # type: ignore[arg-type]
        t_send = time.perf_counter() - t0
        replies = [reply(m, rng) for m in messages]
        t1 = time.perf_counter()
        new, _ = strategy.aggregate_train(rnd, replies)
        seconds.append(t_send + time.perf_counter() - t1)
        arrays = new or arrays
        down, up = serialized_bytes(messages[0].content), serialized_bytes(replies[0].content)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    state = sum(a.nbytes for v in strategy.server_state().values() for a in v)
    disk = sum(p.stat().st_size for p in (run_dir / SERVER_MODELS).glob("*/r*.npz"))
    files = len(list((run_dir / SERVER_MODELS).glob("*/r*.npz")))
    per_file = disk / files if files else 0.0
    shutil.rmtree(run_dir)
    return {"method": method, "clients": n, "model-bytes": model_bytes,
            "peak-heap-mb": peak / 2**20, "state-mb": state / 2**20,
            "disk-mb": disk / 2**20, "disk-all-mb": 2 * n * per_file / 2**20,
            "server-s-per-round": float(np.mean(seconds[1:] or seconds)),
            "down-bytes": down, "up-bytes": up}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--per-round", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    args = ap.parse_args()
    head = (f"{'method':<10} {'N':>6} {'peak heap MB':>12} {'state MB':>9} {'disk MB':>8} "
            f"{'disk all MB':>11} {'server s/rnd':>12} {'down B':>9} {'up B':>9}")
    print(f"{args.per_round} clients per round, {args.rounds} rounds, default CNN")
    print(head)
    print("-" * len(head))
    for n in args.clients:
        for method in args.methods:
            r = measure(method, n, args.per_round, args.rounds)
            print(f"{method:<10} {n:>6} {r['peak-heap-mb']:>12.1f} {r['state-mb']:>9.2f} "
                  f"{r['disk-mb']:>8.1f} {r['disk-all-mb']:>11.0f} "
                  f"{r['server-s-per-round']:>12.3f} {r['down-bytes']:>9,} {r['up-bytes']:>9,}",
                  flush=True)


if __name__ == "__main__":
    main()
