"""Hostile but well-formed replies against the reply checks, through the in-process grid.

One ClientApp (partition 0) is the attacker: whenever it is sampled, its otherwise honest
reply is changed on the way to the server (claims 1e9 examples, scales its model move, or
scales SCAFFOLD's Delta_c). Each attack runs next to the same config without the attacker;
the final test accuracy, the rejected count and the largest honest norm / reference ratio
are printed as one JSON line per run (docs/faults.md quotes them).

  python -m bench.reply_attacks              # every attack
  python -m bench.reply_attacks --norms      # honest norm ratios, four methods, Dir-0.1
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Message, MetricRecord

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.norms import update_norms, vector_norm
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.scaffold import DELTA_C
from server_app.experiment import run_experiment

ATTACKER = 1000  # node of partition 0
FIVE_OF_20 = {"num-clients": 20, "fraction-train": 0.25, "train-limit": 6000,
              "num-server-rounds": 20}
ONE_OF_3 = {"num-clients": 3, "fraction-train": 0.34, "train-limit": 3000,
            "num-server-rounds": 12, "max-failed-rounds": 12}
"""README's deploy_local example size: 1 client per round. The attacker alone in a round
leaves it unaggregated; 3 such rounds in a row would stop the run (max-failed-rounds=3)."""
ATTACKS: dict[str, tuple[dict[str, Any], str]] = {
    "examples-1e9": (FIVE_OF_20, "examples"),
    "examples-1e9-flipped": (FIVE_OF_20, "examples-flipped"),
    "move-x50": (FIVE_OF_20, "x50"),
    "move-x1e6-one-per-round": (ONE_OF_3, "x1e6"),
    "scaffold-delta-c-x1e6": ({**FIVE_OF_20, "method": "scaffold"}, "delta-c"),
    # what the defaults do not stop: inside the norm bound, true example count
    "move-flipped": (FIVE_OF_20, "flipped"),
    "move-x15": (FIVE_OF_20, "x15"),
}


def move_base(grid: InProcessGrid, up: list[np.ndarray], variant: str) -> list[np.ndarray]:
    """What the model upload ``up`` of the reply just handled is a move from: the round's
    global model w_t under ``ri-aggregation=model`` (the upload is w_iK), zero under
    ``update`` (the upload is the move itself)."""
    if variant == "model":
        return unpack(grid.sent[-1].content[rk.ARRAYS])
    return [np.zeros_like(a) for a in up]


def scaled_upload(up: list[np.ndarray], base: list[np.ndarray],
                  scale: float) -> list[np.ndarray]:
    """The upload whose move from ``base`` is ``scale`` times the honest one."""
    return [(b + scale * (u - b)).astype(np.float32) for u, b in zip(up, base, strict=True)]


def poison(grid: InProcessGrid, kind: str, variant: str) -> Callable[[Message], Message]:
    """A reply filter that turns the attacker's train replies hostile (``kind``)."""
    def change(reply: Message) -> Message:
        if (reply.metadata.src_node_id != ATTACKER or reply.has_error()
                or reply.metadata.message_type != "train"):
            return reply
        c = reply.content
        up = unpack(c[rk.ARRAYS])
        scale = {"x50": 50.0, "x15": 15.0, "x1e6": 1e6, "flipped": -1.0,
                 "examples-flipped": -1.0}.get(kind)
        if scale is not None:  # scale the model move, not the weights
            c[rk.ARRAYS] = ArrayRecord(scaled_upload(up, move_base(grid, up, variant), scale))
        if kind.startswith("examples"):
            m = dict(c[rk.METRICS])
            c[rk.METRICS] = MetricRecord({**m, rk.NUM_EXAMPLES: 10**9})
        if kind == "delta-c":
            c[DELTA_C] = ArrayRecord([a * np.float32(1e6) for a in unpack(c[DELTA_C])])
        return reply
    return change


def run(over: dict[str, Any], attack: str | None, tmp: Path) -> dict[str, Any]:
    """One in-process run; the summary numbers docs/faults.md quotes."""
    cfg = RunConfig.parse({"output-dir": str(tmp / "out"), "eval-every": 1000, **over})
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
    if attack:
        grid.reply_filter = poison(grid, attack, cfg.train.ri_aggregation)
    out = tmp / f"run-{attack}"
    run_experiment(grid, cfg, out_dir=out)
    rows = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    last = rows[-1]
    return {"attack": attack, "final-acc": last["test-acc"], "final-loss": last["test-loss"],
            "rejected": sum(r["num-rejected"] for r in rows),
            "max-norm-over-reference": max(r.get("norm-limit-used", 0.0) for r in rows)
            * cfg.robust.max_update_norm_ratio, "config": over}


def first_round_ratios(over: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Honest round-1 moves of EVERY client over ||w_0|| (the first-round bound's base)."""
    cfg = RunConfig.parse({"output-dir": str(tmp / "out"), "eval-every": 1000, **over,
                           "fraction-train": 1.0, "num-server-rounds": 1})
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
    run_experiment(grid, cfg, out_dir=tmp / "r1")
    w0 = unpack(next(m for m in grid.sent if m.metadata.message_type == "train").content[
        rk.ARRAYS])
    ups = [unpack(r.content[rk.ARRAYS]) for r in grid.replies
           if r.metadata.message_type == "train"]
    ratios = np.asarray(update_norms(w0, ups, cfg.train.ri_aggregation)) / vector_norm(w0)
    out = {"method": cfg.method, "w0-norm": vector_norm(w0), "min": float(ratios.min()),
           "median": float(np.median(ratios)), "max": float(ratios.max())}
    if cfg.method == "scaffold":
        dc = [vector_norm(unpack(r.content[DELTA_C])) for r in grid.replies
              if r.metadata.message_type == "train"]
        out["delta-c-over-w0-norm-over-lr"] = max(dc) * cfg.train.lr / vector_norm(w0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--norms", action="store_true", help="honest norm ratios instead")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--train-limit", type=int, default=12000)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.norms:
            for method in args.only or ["fedavg", "scaffold", "feddyn", "fedadam"]:
                over = {"method": method, "train-limit": args.train_limit,
                        "num-server-rounds": args.rounds}
                print(json.dumps(run(over, None, tmp / method)), flush=True)
                print(json.dumps(first_round_ratios(over, tmp / f"{method}-r1")), flush=True)
            return
        honest: dict[str, dict[str, Any]] = {}  # one honest run per distinct config
        for name, (over, attack) in ATTACKS.items():
            if args.only and name not in args.only:
                continue
            key = json.dumps(over, sort_keys=True)
            if key not in honest:
                honest[key] = run(over, None, tmp / f"{name}-honest")
                print(json.dumps({"name": name, **honest[key]}), flush=True)
            print(json.dumps({"name": name, **run(over, attack, tmp / name)}), flush=True)


if __name__ == "__main__":
    main()
