"""What lost replies cost SCAFFOLD and FedDyn when the client's state drifts from the server's.

A client saves its new state (c_i, h_i) when it answers; if the reply is then lost, the server
never counts the change. Before the accounted round (``rk.ACCOUNTED_ROUND``) the client went
on from its newest state anyway; now it starts its server-summed state from the version of
its last aggregated reply. Both run side by side here through the real server loop and
ClientApp (in-process grid, each node's Context in memory as on a SuperNode), with a seeded
share of the train replies dropped after the client answered. "before" is the same code with
the accounted round left out of the message, which is exactly what the clients received
before (they then use their newest state). Per run, one JSON line: the final test accuracy
and the gap ||server state - client sum|| / ||server state|| at the end, where the client sum
is over the state each client will start from next.

  python -m bench.state_drift                   # SCAFFOLD and FedDyn, 3 seeds, 20% dropped
  python -m bench.state_drift --rounds 10 --seeds 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, MessageType, RecordDict

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.feddyn import H_LOCAL
from fedinit.methods.scaffold import C_LOCAL
from fedinit.store.client_store import ClientStore
from server_app import experiment
from strategies.method_strategy import MethodStrategy

SIZE = {"num-clients": 20, "fraction-train": 0.5, "train-limit": 6000, "local-epochs": 1,
        "personal-eval-every": 0, "beta": 0.1}
KEY = {"scaffold": C_LOCAL, "feddyn": H_LOCAL}


class Recorded(MethodStrategy):
    """The real strategy, remembered so that its state can be read after the run."""

    made: list[MethodStrategy] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        Recorded.made.append(self)


class BeforeStrategy(Recorded):
    """The message without the accounted round: clients continue from their newest state."""

    def _client_config(self, round_config: ConfigRecord, cid: int) -> ConfigRecord:
        config = super()._client_config(round_config, cid)
        del config[rk.ACCOUNTED_ROUND]
        return config


def effective_state(grid: InProcessGrid, cfg: RunConfig, strategy: MethodStrategy,
                    experiment_id: str, key: str, shapes: list[np.ndarray]) -> list[np.ndarray]:
    """sum over all clients of ``key`` as each will start its next participation."""
    total = [np.zeros(a.shape, dtype=np.float64) for a in shapes]
    for cid in range(cfg.num_clients):
        ctx = grid.context_of(cid)
        store = ClientStore(memory=RecordDict(dict(ctx.state.items())))
        accounted = None if strategy.accounted is None or isinstance(strategy, BeforeStrategy) \
            else strategy.accounted.get(cid, 0)
        store.restore(experiment_id, cfg.train.num_server_rounds + 1, shapes, accounted, (key,))
        held = store.get(key)
        if held is not None:
            for acc, a in zip(total, held, strict=True):
                acc += a
    return total


def one_run(method: str, seed: int, rounds: int, drop: float, before: bool) -> dict[str, Any]:
    overrides = {**SIZE, "method": method, "seed": seed, "num-server-rounds": rounds,
                 "eval-every": rounds}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.parse({**overrides, "output-dir": tmp})
        grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
        rng = np.random.default_rng([seed, 99])
        grid.reply_filter = lambda r: None if (
            r.metadata.message_type == MessageType.TRAIN and rng.random() < drop) else r
        Recorded.made.clear()
        original = experiment.MethodStrategy
        experiment.MethodStrategy = BeforeStrategy if before else Recorded  # type: ignore[misc]
        try:
            summary = experiment.run_experiment(grid, cfg, out_dir=Path(tmp) / "run")
        finally:
            experiment.MethodStrategy = original  # type: ignore[misc]
        strategy = Recorded.made[0]
        state = strategy.state.arrays()
        server = state["c"] if method == "scaffold" else state["h_sum"]
        clients = effective_state(grid, cfg, strategy, "run", KEY[method], server)
        if method == "scaffold":
            clients = [c / cfg.num_clients for c in clients]
        gap = float(np.sqrt(sum(np.sum((s.astype(np.float64) - c) ** 2)
                                for s, c in zip(server, clients, strict=True)))
                    / np.sqrt(sum(np.sum(s.astype(np.float64) ** 2) for s in server)))
        sent = sum(1 for m in grid.sent if m.metadata.message_type == MessageType.TRAIN)
        got = sum(1 for m in grid.replies if m.metadata.message_type == MessageType.TRAIN)
        return {"method": method, "seed": seed, "mode": "before" if before else "accounted",
                "final-test-acc": summary["final-test-acc"], "state-gap": gap,
                "train-replies": got, "sent": sent}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--drop", type=float, default=0.2)
    ap.add_argument("--methods", default="scaffold,feddyn")
    args = ap.parse_args()
    rows = []
    for method in args.methods.split(","):
        for seed in range(args.seeds):
            for before in (True, False):
                row = one_run(method, seed, args.rounds, args.drop, before)
                rows.append(row)
                print(json.dumps(row), flush=True)
    for method in args.methods.split(","):
        for mode in ("before", "accounted"):
            accs = [r["final-test-acc"] for r in rows if (r["method"], r["mode"]) == (method, mode)]
            gaps = [r["state-gap"] for r in rows if (r["method"], r["mode"]) == (method, mode)]
            spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
            print(f"{method:9s} {mode:9s} acc {100 * statistics.mean(accs):6.2f} +- "
                  f"{100 * spread:.2f}  state gap max {max(gaps):.2e}  ({len(accs)} seeds, "
                  f"{args.drop:.0%} of train replies dropped, {args.rounds} rounds)")


if __name__ == "__main__":
    main()
