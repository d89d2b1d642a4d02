"""What each defence costs and stops: FedAvg, FedInit and SCAFFOLD on Fashion-MNIST Dir-0.1,
eight defences, no attacker and 1 or 2 attackers of the 10 clients of every round.

In process (``fedinit/cli/inprocess_grid.py``: the real round loop and ClientApp handlers). In every
round the FIRST k train replies (in the order the server sends the round's messages) are made
hostile after the honest client trained and saved its state, so exactly k of each round's 10
replies attack and who attacks changes from round to round. Only the model upload is changed
(SCAFFOLD's Delta_c stays honest); its move (from w_t, or the upload itself under
``ri-aggregation=update``, as under DP) becomes:

- ``sign-flip``: minus the honest move (same norm);
- ``x15``: 15 x the honest move (the norm filter's default bound is 20 x a median norm);
- ``direction``: one fixed random unit direction (seeded, the same for every attacker and
  round) times the norm of the attacker's honest move.

Outside the default grid, for SCAFFOLD only (``--threats flip-mean-dc:1``): ``flip-mean-dc``,
issue 35's attack on a selection that scores a reply's uploads concatenated: the move is
sign-flipped AND Delta_c is replaced by the mean of the round's honest Delta_c (the replies of
a round all reach the server together, so the hostile reply is rewritten as each honest one
arrives: a perfect estimate, stronger than one from the broadcast c). ``stall-mean-dc``
(issue 42): the same Delta_c behind a zero move (the model stalls).

One JSON line per cell goes to ``--out`` (finished cells of the same config are skipped, so a
stopped grid resumes); the markdown table is printed and written to ``--md``.

  python -m bench.defence_table                     # the whole grid (168 cells)
  python -m bench.defence_table --part 1/2          # every other cell; run 2/2 beside it
  python -m bench.defence_table --table             # only the table, from --out
  python -m bench.defence_table --methods SCAFFOLD --defences krum --threats flip-mean-dc:1
  python -m bench.defence_table --out experiments/results/defence-table.jsonl  # its missing cells
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, Message, RecordDict

from bench.reply_attacks import move_base, scaled_upload
from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.norms import vector_norm
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.scaffold import DELTA_C
from server_app.experiment import run_experiment

BASE: dict[str, Any] = {"num-clients": 50, "fraction-train": 0.2, "train-limit": 6000,
                        "num-server-rounds": 20, "eval-every": 1000, "personal-eval-every": 0}
"""10 of 50 clients per round; Fashion-MNIST, Dirichlet-0.1 and the rest are the defaults."""
METHODS: dict[str, dict[str, Any]] = {
    "FedAvg": {"method": "fedavg", "beta": 0.0},
    "FedInit": {"method": "fedavg", "beta": 0.1},
    "SCAFFOLD": {"method": "scaffold", "beta": 0.0},
}
DP_CLIP: dict[str, dict[str, float]] = {
    "FedAvg": {"dp-clip": 0.5},
    "FedInit": {"dp-clip": 0.5},
    "SCAFFOLD": {"dp-clip": 0.5, "dp-clip-extra": 2.0},
}
"""About the median honest upload norms (model move 0.51-0.52, SCAFFOLD's Delta_c 1.8) of
each method's no-attack run, 4 rounds at BASE's size (docs/faults.md)."""
OFF = {"max-update-norm-ratio": 0.0}
DEFENCES: dict[str, dict[str, Any]] = {
    "none (mean)": OFF,
    "norm filter": {},  # the default: max-update-norm-ratio = 20
    "median": {**OFF, "aggregation": "median"},
    "trimmed mean": {**OFF, "aggregation": "trimmed-mean", "trim-fraction": 0.2},
    "krum": {**OFF, "aggregation": "krum", "byzantine-f": 2},
    "bulyan": {**OFF, "aggregation": "bulyan", "byzantine-f": 1},  # 10 >= 4f + 3: f <= 1
    "DP z=0.5": {"dp": "central", "dp-noise-multiplier": 0.5, "weighting": "uniform"},
    "DP z=1.0": {"dp": "central", "dp-noise-multiplier": 1.0, "weighting": "uniform"},
}
KINDS = ("sign-flip", "x15", "direction")
THREATS: list[tuple[str, int]] = [("none", 0)] + [(k, n) for k in KINDS for n in (1, 2)]
MEAN_DC = "flip-mean-dc"
STALL_DC = "stall-mean-dc"
DC_KINDS = (MEAN_DC, STALL_DC)
"""The attacks that also rewrite Delta_c (the round's mean honest one)."""
EXTRA_THREATS: list[tuple[str, int]] = [(k, n) for k in DC_KINDS for n in (1, 2)]
"""SCAFFOLD only, run and shown only when ``--threats`` names them."""
ALLOWED = (*KINDS, *DC_KINDS)
SCALE = 15.0
DIRECTION_SEED = 22


def unit_direction(like: list[np.ndarray], seed: int = DIRECTION_SEED) -> list[np.ndarray]:
    """A fixed random direction shaped like ``like``, of unit norm over all arrays jointly."""
    rng = np.random.default_rng(seed)
    raw = [rng.standard_normal(a.shape) for a in like]
    length = vector_norm(raw)
    return [r / length for r in raw]


def hostile_upload(up: list[np.ndarray], base: list[np.ndarray], kind: str,
                   direction: list[np.ndarray]) -> list[np.ndarray]:
    """The upload an attacker sends instead of its honest ``up`` (a move from ``base``)."""
    if kind in ("sign-flip", MEAN_DC):
        return scaled_upload(up, base, -1.0)
    if kind == STALL_DC:
        return scaled_upload(up, base, 0.0)
    if kind == "x15":
        return scaled_upload(up, base, SCALE)
    if kind == "direction":
        size = vector_norm([u.astype(np.float64) - b for u, b in zip(up, base, strict=True)])
        return [(b + size * d).astype(np.float32) for b, d in zip(base, direction, strict=True)]
    raise ValueError(f"attack kind {kind!r} is not allowed; allowed: {', '.join(ALLOWED)}")


class FirstK:
    """Reply filter: the first ``k`` train replies of every round turn hostile (``kind``);
    it also records the honest replies' move norms (and SCAFFOLD's Delta_c norms)."""

    def __init__(self, grid: InProcessGrid, kind: str, k: int, variant: str) -> None:
        if k and kind not in ALLOWED:
            raise ValueError(f"attack kind {kind!r} is not allowed; allowed: {', '.join(ALLOWED)}")
        self.grid, self.kind, self.k, self.variant = grid, kind, k, variant
        self.poisoned: dict[int, int] = {}
        self.hostile: dict[int, set[int]] = {}
        """Round -> the partitions whose replies were made hostile."""
        self.replies: dict[int, int] = {}
        self.honest_norms: list[float] = []
        self.delta_c_norms: list[float] = []
        self._direction: list[np.ndarray] | None = None
        self._mean_dc: dict[int, tuple[list[RecordDict], list[list[np.ndarray]]]] = {}
        """``DC_KINDS``: round -> (its hostile contents, its honest Delta_c so far)."""

    def __call__(self, reply: Message) -> Message:
        if reply.has_error() or reply.metadata.message_type != "train":
            return reply
        rnd = int(self.grid.sent[-1].content[rk.CONFIG][rk.ROUND])
        self.replies[rnd] = self.replies.get(rnd, 0) + 1
        c = reply.content
        up = unpack(c[rk.ARRAYS])
        base = move_base(self.grid, up, self.variant)
        if self.poisoned.get(rnd, 0) >= self.k:
            self.honest_norms.append(vector_norm(
                [u.astype(np.float64) - b for u, b in zip(up, base, strict=True)]))
            if DELTA_C in c:
                self.delta_c_norms.append(vector_norm(unpack(c[DELTA_C])))
                self._follow_mean_dc(rnd, unpack(c[DELTA_C]))
            return reply
        self.poisoned[rnd] = self.poisoned.get(rnd, 0) + 1
        node = reply.metadata.src_node_id
        self.hostile.setdefault(rnd, set()).add(
            int(self.grid.contexts[node].node_config["partition-id"]))
        if self._direction is None:
            self._direction = unit_direction(up)
        c[rk.ARRAYS] = ArrayRecord(hostile_upload(up, base, self.kind, self._direction))
        if self.kind in DC_KINDS:
            self._mean_dc.setdefault(rnd, ([], []))[0].append(c)
        return reply

    def _follow_mean_dc(self, rnd: int, delta_c: list[np.ndarray]) -> None:
        """``DC_KINDS``: the round's hostile replies upload the mean honest Delta_c."""
        if self.kind not in DC_KINDS or rnd not in self._mean_dc:
            return
        targets, seen = self._mean_dc[rnd]
        seen.append(delta_c)
        mean = [np.mean([d[i].astype(np.float64) for d in seen], axis=0).astype(np.float32)
                for i in range(len(delta_c))]
        for content in targets:
            content[DELTA_C] = ArrayRecord(mean)


class Selections(logging.Handler):
    """Reads the server's own log line ``round r: krum aggregates partitions [..]`` (Krum,
    Multi-Krum, Bulyan): round -> the partitions the selection let through."""

    LINE = re.compile(r"round (\d+): \S+ aggregates partitions \[([\d, ]*)\]")

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.chosen: dict[int, set[int]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        m = self.LINE.match(record.getMessage())
        if m:
            self.chosen[int(m[1])] = {int(x) for x in m[2].split(",") if x.strip()}


def hostile_selected(attack: FirstK, seen: Selections) -> int | None:
    """Rounds in which a hostile reply was among those Krum, Multi-Krum or Bulyan selected;
    None where no selection ran (every other defence) or nobody attacked."""
    if not seen.chosen or not attack.hostile:
        return None
    return sum(1 for rnd, bad in attack.hostile.items() if bad & seen.chosen.get(rnd, set()))


def cell_config(method: str, defence: str) -> dict[str, Any]:
    """The run config overrides of one (method, defence) cell."""
    dp = DP_CLIP[method] if defence.startswith("DP") else {}
    return {**BASE, **METHODS[method], **DEFENCES[defence], **dp}


def run_cell(method: str, defence: str, kind: str, k: int, over: dict[str, Any],
             tmp: Path) -> dict[str, Any]:
    """One in-process run; the JSON line the table is built from."""
    cfg = RunConfig.parse({"output-dir": str(tmp / "out"), **over})
    grid = InProcessGrid(cfg.num_clients, cfg.to_dict())
    attack = FirstK(grid, kind, k, cfg.train.ri_aggregation)
    grid.reply_filter = attack
    seen = Selections()
    flwr_log = logging.getLogger("flwr")
    flwr_log.addHandler(seen)
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        run_experiment(grid, cfg, out_dir=tmp / "run")
    finally:
        flwr_log.removeHandler(seen)
    rows = [json.loads(x) for x in (tmp / "run" / "rounds.jsonl").read_text().splitlines()]
    return {"method": method, "defence": defence, "attack": kind, "attackers": k,
            "final-acc": rows[-1]["test-acc"], "final-loss": rows[-1]["test-loss"],
            "dp-epsilon": rows[-1].get("dp-epsilon"),
            "rejected": sum(r.get("num-rejected", 0) for r in rows),
            "unaggregated-rounds": sum(1 for r in rows if r.get("num-replies", 0) < 1),
            "poisoned-per-round": sorted(set(attack.poisoned.values())) or [0],
            "hostile-selected-rounds": hostile_selected(attack, seen),
            "replies-per-round": sorted(set(attack.replies.values())),
            "honest-move-norm-median": float(np.median(attack.honest_norms)),
            "delta-c-norm-median": float(np.median(attack.delta_c_norms))
            if attack.delta_c_norms else None,
            "seconds": round(time.perf_counter() - t0, 1),
            "cpu-seconds": round(time.process_time() - cpu0, 1), "config": over}


def cell_key(over: dict[str, Any], kind: str, k: int) -> str:
    return json.dumps({"config": over, "attack": kind, "attackers": k}, sort_keys=True)


def load(path: Path) -> dict[str, dict[str, Any]]:
    """Finished cells in ``path`` by key (a later line of the same cell wins)."""
    if not path.exists():
        return {}
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {cell_key(r["config"], r["attack"], r["attackers"]): r for r in recs}


def claim(out: Path, key: str) -> bool:
    """True if this process may run the cell: no other live process claimed it (a claim is
    a file naming its pid, beside ``out``), so more workers can join a running grid."""
    path = out.parent / f"{out.name}.claims" / hashlib.sha1(key.encode()).hexdigest()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        pid = int(path.read_text() or 0)
        if pid and pid != os.getpid() and Path(f"/proc/{pid}").exists():
            return False
        path.write_text(str(os.getpid()))
        return True
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def cells(methods: list[str], defences: list[str], extra: dict[str, Any],
          threats: list[tuple[str, int]] = THREATS,
          ) -> list[tuple[str, str, str, int, dict[str, Any]]]:
    """Every cell, in the order they run: per method, first every defence without attacker
    and against one attacker of each kind, then against two (a stopped grid has whole
    columns); ``DC_KINDS`` for SCAFFOLD only."""
    return [(m, d, kind, k, {**cell_config(m, d), **extra})
            for m in methods for two in (False, True) for d in defences
            for kind, k in threats
            if (k == 2) == two and (kind not in DC_KINDS or m == "SCAFFOLD")]


def table(done: dict[str, dict[str, Any]], methods: list[str], defences: list[str],
          extra: dict[str, Any], threats: list[tuple[str, int]] = THREATS) -> str:
    """Markdown: a row per (method, defence), final accuracy per threat (``threats[0]``: no
    attacker), epsilon for DP; ``[n]``: replies the norm filter rejected over the run."""
    head = ["method", "defence", "no attacker"] + [
        f"{kind} x{k}" for kind, k in threats[1:]] + ["epsilon"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for m in methods:
        for d in defences:
            vals, eps = [], "-"
            for kind, k in threats:
                r = done.get(cell_key({**cell_config(m, d), **extra}, kind, k))
                if r is None:
                    vals.append("")
                    continue
                rej = f" [{r['rejected']}]" if r["rejected"] else ""
                vals.append(f"{100 * r['final-acc']:.1f}{rej}")
                if r["dp-epsilon"] is not None:
                    eps = f"{r['dp-epsilon']:.3g}"
            lines.append("| " + " | ".join([m, d, *vals, eps]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path,
                    default=Path("experiments/results/defence-table.jsonl"))
    ap.add_argument("--md", type=Path, default=None, help="also write the table here")
    ap.add_argument("--part", default="1/1", help="i/n: run cells i, i+n, ... (1-based)")
    ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--defences", nargs="*", default=list(DEFENCES), choices=list(DEFENCES))
    ap.add_argument("--threats", nargs="*", default=None, help="kind:k, e.g. none:0 x15:2")
    ap.add_argument("--set", nargs="*", default=[], help="extra key=json-value pairs")
    ap.add_argument("--table", action="store_true", help="only print the table from --out")
    args = ap.parse_args()
    extra = {key: json.loads(value) for key, value in (p.split("=", 1) for p in args.set)}
    i, n = (int(x) for x in args.part.split("/"))
    if not 1 <= i <= n:
        raise SystemExit(f"--part {args.part} is not allowed; allowed: i/n with 1 <= i <= n")
    shown = THREATS + [t for t in EXTRA_THREATS if f"{t[0]}:{t[1]}" in (args.threats or [])]
    todo = cells(args.methods, args.defences, extra, shown)[i - 1::n]
    if args.threats is not None:
        todo = [c for c in todo if f"{c[2]}:{c[3]}" in args.threats]
    torch.set_num_threads(1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for method, defence, kind, k, over in [] if args.table else todo:
        key = cell_key(over, kind, k)
        if key in load(args.out) or not claim(args.out, key):
            continue
        with tempfile.TemporaryDirectory() as d:
            rec = run_cell(method, defence, kind, k, over, Path(d))
        with args.out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(json.dumps(rec), flush=True)
    md = table(load(args.out), args.methods, args.defences, extra, shown)
    if args.md is not None:
        args.md.parent.mkdir(parents=True, exist_ok=True)
        args.md.write_text(md + "\n")
    print(md)


if __name__ == "__main__":
    main()
