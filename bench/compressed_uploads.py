"""Bytes up and accuracy with compressed uploads (issue 44, item 3): the default CNN and data
set, in process (``fedinit.cli.inprocess_grid``, the real ClientApp), one run per codec and seed;
``bytes-up`` summed from the rows (the encoded payload of the aggregated replies).

    .venv/bin/python -m bench.compressed_uploads [--rounds 5] [--clients 10] \
        [--codecs 'off,q8,topk:0.01+q8;server-lr=3'] [--method fedavg] [--train-limit 3000] \
        [--seeds 0 1 2] [--eval-every 5] [--csv runs.csv] [--points-csv points.csv] \
        [--plot accuracy_bytes.png]
    .venv/bin/python -m bench.compressed_uploads --from-points points.csv --codecs off,q8 \
        --seeds 0 1 2 --plot accuracy_bytes.png     # a plot of runs already made

Seeds pair the codecs: a seed fixes the split, w_0 and the sample, so each codec's final
accuracy minus uncompressed's is one paired difference (``fedinit/cli/paired.py``: mean and 95%
Student-t interval over the seeds, printed here; ``fedinit-report paired CSV --by
compression --a off --b q8 --metric test-acc`` reads the same from ``--csv``).
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path
from typing import Any

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.cli.paired import pair, report
from fedinit.cli.run_dirs import read_rows
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from server_app.experiment import run_experiment

RUN_HEAD = ("seed", "compression", "bytes-up", "replies", "bytes-per-reply", "test-acc",
            "seconds")
"""One row per run (``--csv``)."""
POINT_HEAD = ("seed", "compression", "round", "bytes-up-so-far", "test-acc")
"""One row per evaluated round (``--points-csv``, the plot's points)."""


def one_run(raw: dict[str, Any], out: Path) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Total bytes up, replies, final accuracy and seconds of one in-process run, and its
    evaluated rounds with the bytes sent up to them."""
    cfg = RunConfig.parse({**raw, "output-dir": str(out)})
    t0 = time.perf_counter()
    run_experiment(InProcessGrid(cfg.num_clients, raw), cfg, out_dir=out / "run")
    rows = read_rows(out / "run" / "rounds.jsonl")
    points, so_far = [], 0.0
    for r in rows:
        so_far += float(r[rk.BYTES_UP])
        if r.get("test-acc") is not None:
            points.append({"round": float(r["round"]), "bytes-up-so-far": so_far,
                           "test-acc": float(r["test-acc"])})
    return ({"bytes-up": so_far, "replies": float(sum(r[rk.NUM_REPLIES] for r in rows)),
             "test-acc": float(rows[-1]["test-acc"]), "seconds": time.perf_counter() - t0},
            points)


def variant(text: str) -> dict[str, Any]:
    """The run-config keys of one ``--codecs`` entry: the codec, then any ``;key=value``
    (e.g. ``topk:0.01+q8;server-lr=3``: the codec with a server rule's setting); a value is
    an int, a float or the text as given."""
    codec, *extra = text.split(";")
    keys: dict[str, Any] = {"compression": codec}
    for item in extra:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--codecs entry {text!r}: {item!r} is not key=value")
        for kind in (int, float):
            try:
                keys[key] = kind(value)
                break
            except ValueError:
                continue
        else:
            keys[key] = value
    return keys


def write_csv(path: Path, head: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=head)
        w.writeheader()
        w.writerows(rows)


def read_points(path: Path, codecs: list[str], seeds: list[int]) -> list[dict[str, Any]]:
    """The rows of a ``--points-csv`` for these codecs and seeds, in the codecs' order."""
    with path.open(newline="") as f:
        rows = [r for r in csv.DictReader(f)
                if r["compression"] in codecs and int(r["seed"]) in seeds]
    rows.sort(key=lambda r: (codecs.index(r["compression"]), int(r["seed"]),
                             float(r["round"])))
    return [{"seed": int(r["seed"]), "compression": r["compression"],
             "round": float(r["round"]), "bytes-up-so-far": float(r["bytes-up-so-far"]),
             "test-acc": float(r["test-acc"])} for r in rows]


MEAN_FROM_SEEDS = 4
"""From this many seeds a codec is drawn as its mean over seeds with a +-1 std band (one
line per seed is unreadable at ten)."""


def plot(points: list[dict[str, Any]], path: Path) -> None:
    """Test accuracy against the bytes sent up so far, one line per codec and seed (or,
    from ``MEAN_FROM_SEEDS`` seeds, the mean per evaluated round with a +-1 std band)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.5))
    codecs = list(dict.fromkeys(p["compression"] for p in points))
    seeds = sorted({p["seed"] for p in points})
    for i, codec in enumerate(codecs):
        if len(seeds) >= MEAN_FROM_SEEDS:
            rounds = sorted({p["round"] for p in points if p["compression"] == codec})
            at = [[p for p in points if p["compression"] == codec and p["round"] == r]
                  for r in rounds]
            x = [float(np.mean([p["bytes-up-so-far"] for p in ps])) / 1e6 for ps in at]
            acc = [np.array([100 * p["test-acc"] for p in ps]) for ps in at]
            mean, std = np.array([a.mean() for a in acc]), np.array([a.std() for a in acc])
            ax.plot(x, mean, marker="o", markersize=3, color=f"C{i}",
                    label=f"{codec} (mean of {len(acc[-1])})")
            ax.fill_between(x, mean - std, mean + std, color=f"C{i}", alpha=0.15)
            continue
        for k, seed in enumerate(seeds):
            mine = [p for p in points if p["compression"] == codec and p["seed"] == seed]
            ax.plot([p["bytes-up-so-far"] / 1e6 for p in mine],
                    [100 * p["test-acc"] for p in mine], marker="o", markersize=3,
                    color=f"C{i}", alpha=0.8, label=codec if k == 0 else None)
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("bytes sent up so far, all clients (MB, log scale)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Compressed uploads: accuracy against bytes up "
                 + ("(mean +- std over seeds)" if len(seeds) >= MEAN_FROM_SEEDS
                    else "(one line per seed)"))
    ax.grid(True, alpha=0.3)
    ax.legend(title="compression")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.3)
    parser.add_argument("--train-limit", type=int, default=3000)
    parser.add_argument("--method", default="fedavg")
    parser.add_argument("--codecs", default="off,q8,topk:0.01+q8",
                        help="comma-separated codecs, each optionally with ';key=value' "
                             "run-config keys (its CSV label is the whole entry)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--eval-every", type=int, default=0,
                        help="evaluate every E rounds (0: the last round only)")
    parser.add_argument("--csv", type=Path, help="one row per run")
    parser.add_argument("--points-csv", type=Path, help="one row per evaluated round")
    parser.add_argument("--plot", type=Path, help="accuracy against bytes up (PNG)")
    parser.add_argument("--from-points", type=Path,
                        help="run nothing: plot (--plot) this --points-csv's rows of --codecs "
                             "and --seeds")
    args = parser.parse_args()
    if args.from_points:
        if not args.plot:
            raise SystemExit("--from-points needs --plot PNG")
        plot(read_points(args.from_points, args.codecs.split(","), args.seeds), args.plot)
        return
    runs: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            base = {"method": args.method, "num-server-rounds": args.rounds,
                    "num-clients": args.clients, "fraction-train": args.fraction,
                    "train-limit": args.train_limit,
                    "eval-every": args.eval_every or args.rounds,
                    "personal-eval-every": 0, "seed": seed}
            for codec in args.codecs.split(","):
                got, pts = one_run({**base, **variant(codec)},
                                   Path(tmp) / f"s{seed}-c{len(runs)}")
                runs.append({"seed": seed, "compression": codec, **got,
                             "bytes-per-reply": got["bytes-up"] / max(got["replies"], 1.0)})
                points += [{"seed": seed, "compression": codec, **p} for p in pts]
                print(f"seed {seed} {codec}: {100 * got['test-acc']:.2f}% "
                      f"{runs[-1]['bytes-per-reply']:,.0f} B per reply "
                      f"{got['seconds']:.0f} s", flush=True)
    if args.csv:
        write_csv(args.csv, RUN_HEAD, runs)
    if args.points_csv:
        write_csv(args.points_csv, POINT_HEAD, points)
    if args.plot:
        plot(points, args.plot)
    codecs = args.codecs.split(",")
    print(f"{'compression':<14} {'bytes-up/reply':>15} {'x fewer':>8} {'test-acc':>9} "
          f"{'s':>6}  (means over {len(args.seeds)} seed(s))")
    per = {c: [r for r in runs if r["compression"] == c] for c in codecs}
    plain = per.get("off")
    for codec in codecs:
        rs = per[codec]
        b = sum(r["bytes-per-reply"] for r in rs) / len(rs)
        fewer = (sum(r["bytes-per-reply"] for r in plain) / len(plain)) / b if plain else 0.0
        print(f"{codec:<14} {b:>15,.0f} {fewer:>8.2f} "
              f"{100 * sum(r['test-acc'] for r in rs) / len(rs):>8.2f}% "
              f"{sum(r['seconds'] for r in rs) / len(rs):>6.1f}")
    if plain and len(args.seeds) >= 2:
        table = [{k: str(v) for k, v in r.items()} for r in runs]
        for codec in codecs:
            if codec != "off":
                print(report(pair(table, "compression", "off", codec, "test-acc"), "off",
                             codec, "test-acc"))


if __name__ == "__main__":
    main()
