"""Bytes per client per round, down and up, for every method with and without RI.

Measured on real messages for the default CNN: the method's server half builds them
(``configure_train``), the real ClientApp ``train_fn`` answers them in-process
(``fedinit.cli.inprocess_grid``), and round 2 is measured (round 1's control variates are zeros,
which Flower's content-addressed serialization may deduplicate). Columns:
arrays = sum of ``ArrayRecord.count_bytes()``; records = every record plus its name;
serialized = the RecordDict's object tree as Flower deflates it.

    .venv/bin/python -m bench.wire_bytes [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile

from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods.registry import METHODS, composes_with_ri
from fedinit.task.federated_data import dataset_of
from fedinit.task.models import initial_weights
from strategies.method_strategy import MethodStrategy
from testbeds.lsq_problem import array_bytes, record_bytes, serialized_bytes

MEASURES = (("arrays", array_bytes), ("records", record_bytes),
            ("serialized", serialized_bytes))


def measure(raw: dict[str, object]) -> dict[str, tuple[int, int]]:
    """{measure: (down, up)} bytes of one client in round 2 of a real in-process run."""
    cfg = RunConfig.parse(raw)
    data = dataset_of(cfg)
    grid = InProcessGrid(cfg.num_clients, raw)
    w0 = initial_weights(cfg, data)
    strategy = MethodStrategy.for_run(cfg, {p: 1000 + p for p in range(cfg.num_clients)}, w0)
    arrays = ArrayRecord(w0)
    down: list[RecordDict] = []
    up: list[RecordDict] = []
    for rnd in (1, 2):
        messages = list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid))
        replies = list(grid.send_and_receive(messages))
        errors = [r.error.reason for r in replies if r.has_error()]
        if errors:
            raise RuntimeError(errors[0])
        new, _ = strategy.aggregate_train(rnd, replies)
        arrays = new or arrays
        down, up = [m.content for m in messages], [r.content for r in replies]
    return {name: (fn(down[0]), fn(up[0])) for name, fn in MEASURES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="", help="Fashion-MNIST location (default: config's)")
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="wire-bytes-")
    base = {"num-clients": 10, "fraction-train": 0.1, "train-limit": 2000, "local-epochs": 1,
            "model": "cnn", "dataset": "fashion-mnist", "data-dir": args.data_dir,
            "output-dir": out}
    rows = []
    for method in METHODS:
        for beta in (0.0, 0.1) if composes_with_ri(method) else (0.0,):
            m = measure({**base, "method": method, "beta": beta})
            rows.append((method + ("+RI" if beta else ""), m))
    ref = dict(rows)["fedavg"]
    head = (f"{'method':<13} {'down arrays':>12} {'records':>9} {'serialized':>10} {'x':>5}"
            f"  {'up arrays':>10} {'records':>9} {'serialized':>10} {'x':>5}")
    print("bytes per client per round (round 2), default CNN "
          f"({ref['arrays'][0]:,} bytes of parameters + array names)")
    print(head)
    print("-" * len(head))
    for name, m in rows:
        print(f"{name:<13} {m['arrays'][0]:>12,} {m['records'][0]:>9,} {m['serialized'][0]:>10,}"
              f" {m['serialized'][0] / ref['serialized'][0]:>5.2f}"
              f"  {m['arrays'][1]:>10,} {m['records'][1]:>9,} {m['serialized'][1]:>10,}"
              f" {m['serialized'][1] / ref['serialized'][1]:>5.2f}")


if __name__ == "__main__":
    main()
