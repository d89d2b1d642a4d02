"""Each ``aggregation`` with 0 and 1 sign-flipping attacker, in process, Fashion-MNIST Dir-0.1.

The attacker (partition 0, ``bench.reply_attacks``) uploads minus its honest move, same norm,
whenever it is sampled. Each run prints one JSON line: final accuracy and, measured on the
honest replies of every round, how the round's robust statistic of the moves compares with
their example-weighted mean (norm ratio, cosine) and with their unweighted mean: the evidence
docs/faults.md quotes for why ``median`` trails ``mean`` on this split.

  python -m bench.robust_grid                          # 20 clients, 10 per round, 20 rounds
  python -m bench.robust_grid --five                   # the issue's size: 5 clients, all train
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Message

from bench.reply_attacks import ATTACKER, poison
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.norms import vector_norm
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.ri import weighted_mean
from fedinit.methods.robust import combine
from server_app.experiment import run_experiment

TWENTY = {"num-clients": 20, "fraction-train": 0.5, "train-limit": 6000,
          "num-server-rounds": 20}
FIVE = {"num-clients": 5, "fraction-train": 1.0, "train-limit": 3000, "num-server-rounds": 10}
KINDS = ("mean", "median", "trimmed-mean", "krum", "multi-krum", "bulyan")


def flat(w: list[np.ndarray]) -> np.ndarray:
    return np.concatenate([a.astype(np.float64).ravel() for a in w])


def round_stats(rounds: list[tuple[list[list[np.ndarray]], list[float]]],
                kind: str, cfg: RunConfig) -> dict[str, float]:
    """Mean over rounds of ||stat(moves)|| / ||weighted mean||, cos(stat, weighted mean),
    cos(stat, unweighted mean) for the honest moves of each round."""
    ratio, cos_w, cos_u = [], [], []
    for moves, weights in rounds:
        if len(moves) < 3:
            continue
        wm = flat(weighted_mean(moves, weights))
        um = flat(weighted_mean(moves, [1.0] * len(moves)))
        stat = flat(combine(moves, weights, "median" if kind in ("mean", "krum", "multi-krum",
                                                               "bulyan") else kind,
                            cfg.robust.trim_fraction))
        ratio.append(float(np.linalg.norm(stat) / np.linalg.norm(wm)))
        cos_w.append(float(stat @ wm / np.linalg.norm(stat) / np.linalg.norm(wm)))
        cos_u.append(float(stat @ um / np.linalg.norm(stat) / np.linalg.norm(um)))
    return {"median-norm-over-mean": float(np.mean(ratio)) if ratio else 0.0,
            "cos-median-mean": float(np.mean(cos_w)) if cos_w else 0.0,
            "cos-median-unweighted-mean": float(np.mean(cos_u)) if cos_u else 0.0}


def run(over: dict[str, Any], attack: bool, tmp: Path) -> dict[str, Any]:
    cfg = RunConfig.parse({"output-dir": str(tmp / "out"), "eval-every": 1000, **over})
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
    flip = poison(grid, "flipped", cfg.train.ri_aggregation) if attack else None
    rounds: dict[int, tuple[list[list[np.ndarray]], list[float]]] = {}

    def watch(reply: Message) -> Message:
        if reply.metadata.message_type == "train" and not reply.has_error():
            sent = grid.sent[-1].content
            rnd = int(sent[rk.CONFIG][rk.ROUND])
            w_t = unpack(sent[rk.ARRAYS])
            up = unpack(reply.content[rk.ARRAYS])
            move = up if cfg.train.ri_aggregation == "update" else [
                (u.astype(np.float64) - w).astype(np.float32) for u, w in zip(up, w_t, strict=True)]
            if reply.metadata.src_node_id != ATTACKER or not attack:
                moves, weights = rounds.setdefault(rnd, ([], []))
                moves.append(move)
                weights.append(float(reply.content[rk.METRICS][rk.NUM_EXAMPLES]))
        return flip(reply) if flip else reply

    grid.reply_filter = watch
    out = tmp / "run"
    run_experiment(grid, cfg, out_dir=out)
    rows = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    norms = [vector_norm(weighted_mean(m, w)) for m, w in rounds.values()]
    return {"aggregation": cfg.robust.aggregation, "attackers": int(attack),
            "final-acc": rows[-1]["test-acc"], "unaggregated-rounds": sum(
                1 for r in rows if r.get("num-replies", 1) < cfg.fleet.min_replies),
            "mean-move-norm": float(np.mean(norms)),
            **round_stats(list(rounds.values()), cfg.robust.aggregation, cfg), "config": over}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--five", action="store_true", help="5 clients, all sampled, 10 rounds")
    ap.add_argument("--only", nargs="*", default=list(KINDS))
    ap.add_argument("--attackers", nargs="*", type=int, default=[0, 1])
    ap.add_argument("--set", nargs="*", default=[], help="extra key=json-value pairs")
    args = ap.parse_args()
    base = dict(FIVE if args.five else TWENTY)
    for pair in args.set:
        key, value = pair.split("=", 1)
        base[key] = json.loads(value)
    for kind in args.only:
        for n in args.attackers:
            with tempfile.TemporaryDirectory() as d:
                print(json.dumps(run({**base, "aggregation": kind}, n > 0, Path(d))),
                      flush=True)


if __name__ == "__main__":
    main()
