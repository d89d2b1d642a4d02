"""Sync, sync with over-selection and async (FedBuff) on the virtual clock (``device-speeds``).

Fashion-MNIST Dirichlet-0.1, FedAvg (beta 0) and FedInit (beta 0.1), each under every
``--speeds`` spec (default: 20% and 50% of the devices 5x slower, lognormal sigma 1), each
mode on the same seed and data; in process (``fedinit/cli/inprocess_grid.py``), one run after the
other. Printed per (speeds, method, mode), mean over ``--seeds``: simulated seconds to
``--target`` accuracy (``-``: not reached), accuracy at a fixed simulated time (the earliest
of the three modes' final ``sim-time`` for that speeds/method/seed, so every mode is measured
inside its run), final accuracy after the same number of accepted client updates (rounds x m
= flushes x buffer-size), and the speed-up of async and over-select against sync. Every run's
rows go to ``--out`` (JSON), every evaluated point to ``--csv``, and ``--plot`` draws
accuracy against simulated time.

The gap to sync after the same updates (issue 32): ``last-5`` is the mean of a run's last
five evaluations (one evaluation swings by several points at Dirichlet 0.1); each run's
line names who its updates came from (``participation``); ``--modes`` adds the async
variants of ``REMEDIES``, and ``--task-time task`` is the scenario where a task's simulated
time is its device's alone (speeds labelled ``SPEC/task``).

    .venv/bin/python -m bench.async_speed [--clients 100] [--rounds 30] [--seeds 0]
        [--train-limit 12000] [--target 0.7] [--plot docs/img/async_speed.png]
        [--modes sync async async-balanced ...] [--task-time task] [--csv points.csv]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from fedinit.config.device_speeds import slowdowns
from fedinit.task.federated_data import partition_sizes
from fedinit.task.models import get_weights, initial_model
from server_app.async_rounds import run_async_experiment
from server_app.experiment import run_experiment
from strategies.virtual_clock import VirtualClock

METHODS = {"fedavg": {"beta": 0.0}, "fedinit": {"beta": 0.1}}
MODES = {"sync": {}, "over-select": {"over-select": 0.3}, "async": {"rounds": "async"}}
REMEDIES = {"async-balanced": {"rounds": "async", "refill": "balanced"},
            "async-constant": {"rounds": "async", "staleness": "constant"},
            "async-half": {"rounds": "async"},
            "async-dc": {"rounds": "async", "stale-correction": "dc"},
            "async-conc": {"rounds": "async"}}
"""Async variants measured against the gap to sync after the same updates (``--modes``);
not among the modes whose earliest end fixes the time T of ``acc@T``. ``async-half``:
concurrency m/2 with buffer-size m (set in ``main``), so about half the replies of a flush
started from the newest version (with concurrency = buffer-size nearly every reply is a
version stale). ``async-dc``: delay compensation, one mode ``async-dcL`` per
``--dc-lambdas`` value L; ``async-conc``: one mode ``async-cC`` per ``--concurrencies``
value C, with buffer-size m (``expand``)."""
SPEEDS = ("slow:0.2:5", "slow:0.5:5", "lognormal:1")


def expand(modes: list[str], m_round: int, dc_lambdas: list[float],
           concurrencies: list[int]) -> dict[str, dict[str, Any]]:
    """The run-config overrides of each named mode, ``async-dc`` and ``async-conc`` expanded
    into one mode per lambda / concurrency (buffer-size m: the trade-off's points)."""
    out: dict[str, dict[str, Any]] = {}
    for mode in modes:
        over = {**MODES, **REMEDIES}[mode]
        if mode == "async-half":
            out[mode] = {**over, "concurrency": max(1, m_round // 2), "buffer-size": m_round}
        elif mode == "async-dc":
            out.update({f"async-dc{lam:g}": {**over, "dc-lambda": lam} for lam in dc_lambdas})
        elif mode == "async-conc":
            out.update({f"async-c{c}": {**over, "concurrency": c, "buffer-size": m_round}
                        for c in concurrencies})
        else:
            out[mode] = over
    return out


def custom_modes(specs: list[str]) -> dict[str, dict[str, Any]]:
    """``--custom NAME=KEY:VALUE[,KEY:VALUE...]``: a mode of run-config overrides (a value
    read as JSON when it parses, else as a string), e.g. ``async-m0.5=rounds:async,
    server-momentum:0.5``."""
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        name, sep, body = spec.partition("=")
        pairs = [p.partition(":") for p in body.split(",") if p]
        if not sep or not name or any(not k or not c for k, c, _ in pairs):
            raise SystemExit(f"--custom {spec!r} is not allowed; allowed: "
                             "NAME=KEY:VALUE[,KEY:VALUE...]")
        out[name] = {k: _value(v) for k, _, v in pairs}
    return out


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def one_run(base: dict[str, Any], out: Path,
            stop: Any = None) -> list[dict[str, Any]]:
    """One run in process: its rounds.jsonl rows (an async run ends early when ``stop``,
    given its rows so far, says so)."""
    cfg = RunConfig.parse({**base, "output-dir": str(out)})
    if cfg.schedule.rounds == "async":
        seen: list[dict[str, Any]] = []

        def until(row: dict[str, Any]) -> bool:
            seen.append(row)
            return stop is not None and stop(seen)

        run_async_experiment(InProcessGrid(cfg.num_clients, cfg.to_dict()), cfg,
                             out_dir=out / "run", stop=until)
    else:
        run_experiment(InProcessGrid(cfg.num_clients, cfg.to_dict()), cfg, out_dir=out / "run")
    return [json.loads(x) for x in (out / "run" / "rounds.jsonl").read_text().splitlines()]


def pairing(raw: dict[str, Any]) -> str:
    """What a paired comparison assumes the modes of one seed share, hashed: the initial
    model w_0, every client's partition size (the split) and every client's simulated task
    seconds (the device speeds). Equal across a seed's modes or the bench stops."""
    cfg = RunConfig.parse({**raw, "rounds": "sync", "async-lr-scale": 0.0,
                           "output-dir": "/tmp/unused"})  # an async-only key, refused in sync
    h = hashlib.sha256()
    for a in get_weights(initial_model(cfg)):
        h.update(np.ascontiguousarray(a).tobytes())
    h.update(np.asarray(partition_sizes(cfg), dtype=np.int64).tobytes())
    clock = VirtualClock.for_run(cfg)
    if clock is not None:
        h.update(clock.task_seconds.tobytes())
    return h.hexdigest()[:12]


def reach(rows: list[dict[str, Any]], acc: float, smooth: int = 1) -> int | None:
    """The first row's ``round`` at which the mean of the last ``smooth`` evaluations is at
    least ``acc`` (1: the evaluation itself), or None when no row gets there."""
    seen: list[float] = []
    for r in rows:
        if r["test-acc"] is None:
            continue
        seen.append(r["test-acc"])
        if len(seen) >= smooth and float(np.mean(seen[-smooth:])) >= acc - 1e-12:
            return int(r["round"])
    return None


def sync_stop(sync_rows: list[dict[str, Any]], target: float, last5: bool = True) -> Any:
    """``--until-sync``'s stop condition of an async run: once it has reached sync's final
    accuracy (of the same seed) and ``target``, and (``last5``) sync's last-5 mean with its
    own last-5 mean."""
    final, five = evaluated(sync_rows)[-1][1], last_mean(sync_rows)

    def stop(rows: list[dict[str, Any]]) -> bool:
        return (reach(rows, final) is not None and reach(rows, target) is not None
                and (not last5 or reach(rows, five, 5) is not None))

    return stop


PAIRED_HEAD = ("device-speeds", "method", "seed", "mode", "pairing", "updates-per-flush",
               "sync-updates", "sync-final", "sync-last5", "updates-to-sync-final",
               "updates-to-sync-last5", "reached", "reached-last5", "ratio-to-sync-final",
               "ratio-to-sync-last5", "t-to-target", "sync-t-to-target", "speed-up",
               "acc-at-sync-updates", "last5-at-sync-updates", "flushes-run")
"""``--paired-csv``: one row per (speeds, method, seed, mode) against sync of the same seed:
the accepted updates a mode needed to reach sync's final accuracy (first evaluation at or
above it) and sync's last-5 mean (its own last-5 mean at or above it), each also as a ratio
to sync's updates; ``reached`` 0 means the run ended (its cap) first and the counts are the
run's whole updates (a lower bound; ``reached-last5`` the same for the last-5 count); the
simulated time to ``--target`` and sync's over it;
and the accuracy after the same updates as sync."""


def paired_rows(key: str, seed: str, runs: dict[str, list[dict[str, Any]]], target: float,
                per_flush: dict[str, int], m: int, prints: dict[str, str]) -> list[list[Any]]:
    """The ``PAIRED_HEAD`` rows of one seed (every mode, sync's own as the reference)."""
    speeds, method = key.split("|")
    sync = runs["sync"]
    s_final, s_five = evaluated(sync)[-1][1], last_mean(sync)
    s_updates = int(sync[-1]["round"]) * m
    s_time = time_to(evaluated(sync), target)
    out = []
    for mode, rows in runs.items():
        k = per_flush[mode]
        to_final, to_five = reach(rows, s_final), reach(rows, s_five, 5)
        whole = int(rows[-1]["round"]) * k
        u_final = whole if to_final is None else to_final * k
        u_five = whole if to_five is None else to_five * k
        same = [r for r in rows if int(r["round"]) * k <= s_updates]
        t = time_to(evaluated(rows), target)
        out.append([speeds, method, seed, mode, prints[mode], k, s_updates,
                    f"{s_final:.4f}", f"{s_five:.4f}", u_final, u_five,
                    int(to_final is not None), int(to_five is not None),
                    f"{u_final / s_updates:.4f}", f"{u_five / s_updates:.4f}",
                    f"{t:.4f}", f"{s_time:.4f}", f"{s_time / t:.4f}",
                    f"{evaluated(same)[-1][1]:.4f}", f"{last_mean(same):.4f}", len(rows)])
    return out


def write_paired(rows: list[list[Any]], path: Path) -> None:
    """Append ``rows`` to ``path`` (its header first when it is new)."""
    new = not path.exists()
    with path.open("a", newline="") as f:
        out = csv.writer(f)
        if new:
            out.writerow(PAIRED_HEAD)
        out.writerows(rows)


def participation(rows: list[dict[str, Any]], base: dict[str, Any], seed: int,
                  speeds: str) -> str:
    """Who the run's updates came from: examples per update (the partitions' sizes), the
    share of updates from the slowed devices (s_i > 1), the largest count of one client, and
    the mean staleness (0 under sync): the factors the gap to sync could come from."""
    cfg = RunConfig.parse({**base, "seed": seed, "device-speeds": speeds})
    sizes = np.asarray(partition_sizes(cfg))
    slow = slowdowns(speeds, cfg.num_clients, seed)
    clients = [c for r in rows for c in r["clients-trained"]]
    count = np.bincount(clients, minlength=cfg.num_clients)
    share = float(count[slow > 1].sum() / count.sum()) if slow is not None else math.nan
    tau = [r["staleness-mean"] for r in rows if r.get("staleness-mean") is not None]
    return (f"updates {count.sum()}, examples/update {(count * sizes).sum() / count.sum():.1f} "
            f"(all clients' mean {sizes.mean():.1f}), slowed devices' share {share:.2f} "
            f"(of the clients {float((slow > 1).mean()) if slow is not None else 0:.2f}), "
            f"most updates of one client {count.max()}, mean staleness "
            f"{float(np.mean(tau)) if tau else 0.0:.2f}")


def evaluated(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(sim-time, test-acc) of every row with an evaluation."""
    return [(r["sim-time"], r["test-acc"]) for r in rows if r["test-acc"] is not None]


def time_to(points: list[tuple[float, float]], target: float) -> float:
    return next((t for t, a in points if a >= target), math.nan)


def acc_at(points: list[tuple[float, float]], when: float) -> float:
    """The last evaluated accuracy at or before simulated time ``when``."""
    before = [a for t, a in points if t <= when + 1e-9]
    return before[-1] if before else math.nan


def cell(runs: dict[str, list[dict[str, Any]]], target: float) -> dict[str, dict[str, float]]:
    """One seed's figures for the three modes of one speeds/method."""
    points = {m: evaluated(rows) for m, rows in runs.items()}
    fixed = min((p[-1][0] for m, p in points.items() if m in MODES),
                default=min(p[-1][0] for p in points.values()))
    return {m: {"to-target": time_to(p, target), "acc-at-fixed": acc_at(p, fixed),
                "fixed": fixed, "final": p[-1][1], "last-5": last_mean(runs[m]),
                "end": p[-1][0]}
            for m, p in points.items()}


def last_mean(rows: list[dict[str, Any]], count: int = 5) -> float:
    """The mean of the run's last ``count`` evaluations: its final accuracy with less of one
    evaluation's noise (Dir-0.1 curves swing by several points from one to the next)."""
    acc = [r["test-acc"] for r in rows if r["test-acc"] is not None]
    return float(np.mean(acc[-count:])) if acc else math.nan


def mean(values: list[float]) -> float:
    ok = [v for v in values if not math.isnan(v)]
    return float(np.mean(ok)) if len(ok) == len(values) and ok else math.nan


def table(results: dict[str, Any], target: float) -> str:
    """The printed table: one line per speeds/method/mode, means over seeds."""
    head = (f"{'speeds':<12} {'method':<8} {'mode':<12} {'t->' + format(target, '.0%'):>9} "
            f"{'speed-up':>8} {'acc@T':>6} {'T':>7} {'final':>6} {'last-5':>6} {'sim end':>8}")
    lines = [head]
    for key, seeds in results.items():
        speeds, method = key.split("|")
        cells = [cell(runs, target) for runs in seeds.values()]
        sync_t = mean([c["sync"]["to-target"] if "sync" in c else math.nan for c in cells])
        for mode in dict.fromkeys(m for c in cells for m in c):
            if not all(mode in c for c in cells):
                continue
            t = mean([c[mode]["to-target"] for c in cells])
            lines.append(
                f"{speeds:<12} {method:<8} {mode:<12} {fmt(t, '.1f'):>9} "
                f"{fmt(sync_t / t, '.2f') + 'x':>8} "
                f"{fmt(100 * mean([c[mode]['acc-at-fixed'] for c in cells]), '.2f'):>6} "
                f"{fmt(mean([c[mode]['fixed'] for c in cells]), '.1f'):>7} "
                f"{fmt(100 * mean([c[mode]['final'] for c in cells]), '.2f'):>6} "
                f"{fmt(100 * mean([c[mode]['last-5'] for c in cells]), '.2f'):>6} "
                f"{fmt(mean([c[mode]['end'] for c in cells]), '.1f'):>8}")
    return "\n".join(lines)


def fmt(x: float, spec: str) -> str:
    return "-" if math.isnan(x) else format(x, spec)


def plot(results: dict[str, Any], path: Path, target: float, label: str) -> None:
    """Accuracy against simulated time: one panel per speeds spec, seed 0's runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    speeds = list(dict.fromkeys(k.split("|")[0] for k in results))
    fig, axes = plt.subplots(1, len(speeds), figsize=(5 * len(speeds), 3.8), squeeze=False)
    styles = {"sync": "-", "over-select": "--", "async": ":", "async-long": "-.",
              "async-balanced": (0, (5, 1, 1, 1)), "async-half": (0, (1, 3)),
              "async-c8": (0, (3, 1))}
    colours = {"fedavg": "tab:blue", "fedinit": "tab:red"}
    for ax, sp in zip(axes[0], speeds, strict=True):
        for key, seeds in results.items():
            if key.split("|")[0] != sp:
                continue
            method = key.split("|")[1]
            runs = seeds[min(seeds, key=lambda s: (len(s), s))]  # numeric order of the seeds
            for mode, rows in runs.items():
                if mode == "async" and "async-long" in runs:
                    continue  # the long run's first flushes are this run, bit for bit
                pts = evaluated(rows)
                ax.plot([t for t, _ in pts], [100 * a for _, a in pts],
                        linestyle=styles.get(mode, "-"), color=colours[method],
                        label=f"{method} {mode}")  # a dash tuple is no format string
        ax.axhline(100 * target, color="grey", lw=0.5)
        ax.set_title(f"device-speeds={sp}")
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("test accuracy (%)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{label}; the lowest seed's runs plotted", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--clients", type=int, default=100)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--train-limit", type=int, default=12000)
    ap.add_argument("--eval-every", type=int, default=2)
    ap.add_argument("--target", type=float, default=0.7)
    ap.add_argument("--speeds", nargs="+", default=list(SPEEDS))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--out", type=Path, default=None, help="write every run's rows here")
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--async-rounds", type=int, default=0,
                    help="also run async for this many flushes (mode async-long): its time "
                         "to the target when the equal-update async run stops short of it")
    ap.add_argument("--modes", nargs="*", default=list(MODES),
                    choices=[*MODES, *REMEDIES])  # --custom adds more
    ap.add_argument("--dc-lambdas", type=float, nargs="+", default=[0.5],
                    help="mode async-dc: one run per dc-lambda (modes async-dcL)")
    ap.add_argument("--concurrencies", type=int, nargs="+", default=[7, 8],
                    help="mode async-conc: one run per concurrency, buffer-size m "
                         "(modes async-cC)")
    ap.add_argument("--task-time", default="steps", choices=["steps", "task"],
                    help="the clock's duration model (task-time): task is a separate "
                         "scenario, its speeds labelled SPEC/task")
    ap.add_argument("--custom", nargs="*", default=[], metavar="NAME=KEY:VALUE,...",
                    help="extra modes of run-config overrides, e.g. "
                         "async-m0.5=rounds:async,server-momentum:0.5")
    ap.add_argument("--until-sync", type=int, default=0, metavar="CAP",
                    help="run every async mode up to CAP flushes, ending it once it has "
                         "reached sync's final accuracy, sync's last-5 mean (with its own "
                         "last-5) and --target (sync runs first, same seed)")
    ap.add_argument("--reuse", type=Path, nargs="*", default=[],
                    help="--out files of earlier runs: a (speeds, method, seed, mode) they hold "
                         "is taken from them, not run again (e.g. sync for --until-sync)")
    ap.add_argument("--no-last5-stop", action="store_true",
                    help="--until-sync: do not wait for the last-5 mean to pass sync's (its "
                         "updates-to-sync-last5 is then often the run's whole, reached 0)")
    ap.add_argument("--paired-csv", type=Path, default=None,
                    help="append one row per (speeds, method, seed, mode) against sync of "
                         "the same seed (PAIRED_HEAD): updates to reach sync's final, ...; "
                         "with --rows, of the saved runs (every mode at m updates per flush, "
                         "pairing '-')")
    ap.add_argument("--rows", type=Path, nargs="+", default=None,
                    help="only print/plot saved --out files or --csv files (seeds merged)")
    ap.add_argument("--csv", type=Path, default=None,
                    help="write every evaluated point (speeds, method, seed, mode, round, "
                         "sim-time, test-acc) here")
    a = ap.parse_args()
    torch.set_num_threads(1)
    base = {"num-clients": a.clients, "fraction-train": a.fraction,
            "num-server-rounds": a.rounds, "partition": "dirichlet", "dirichlet-alpha": 0.1,
            "train-limit": a.train_limit, "eval-every": a.eval_every, "local-epochs": 1,
            "personal-eval-every": 0, "tracking": "off", "task-time": a.task_time}
    label = (f"Fashion-MNIST Dir-0.1, {a.clients} clients, m={round(a.fraction * a.clients)}, "
             f"{a.rounds} rounds/flushes, train-limit {a.train_limit}, seeds {a.seeds}")
    results: dict[str, Any]
    if a.rows is not None:
        results = {}
        for path in a.rows:
            saved = csv_rows(path) if path.suffix == ".csv" else json.loads(path.read_text())
            for key, seeds in saved.items():
                for seed, runs in seeds.items():
                    results.setdefault(key, {}).setdefault(seed, {}).update(runs)
        label = (f"{label.split(', seeds')[0]}, seeds "
                 f"{sorted(next(iter(results.values())), key=lambda s: (len(s), s))}")
    else:
        results = {}
        saved: dict[str, Any] = {}
        for path in a.reuse:
            for key, seeds in json.loads(path.read_text()).items():
                for seed, runs in seeds.items():
                    saved.setdefault(key, {}).setdefault(seed, {}).update(runs)
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory() as tmp:
            for sp in a.speeds:
                for method in a.methods:
                    key = f"{sp}{'/task' if a.task_time == 'task' else ''}|{method}"
                    for seed in a.seeds:
                        m = max(1, round(a.fraction * a.clients))
                        modes = expand(a.modes, m, a.dc_lambdas, a.concurrencies)
                        modes.update(custom_modes(a.custom))
                        if a.async_rounds:
                            modes["async-long"] = {"rounds": "async",
                                                   "num-server-rounds": a.async_rounds}
                        if a.until_sync:  # sync first: its end is the async runs' target
                            modes = {"sync": {}, **modes}
                        prints: dict[str, str] = {}
                        per_flush: dict[str, int] = {}
                        for mode, over in modes.items():
                            raw = {**base, **METHODS[method], **over, "seed": seed,
                                   "device-speeds": sp}
                            stop = None
                            if a.until_sync and raw.get("rounds") == "async":
                                raw["num-server-rounds"] = a.until_sync
                                stop = sync_stop(results[key][str(seed)]["sync"], a.target,
                                                 not a.no_last5_stop)
                            prints[mode] = pairing(raw)
                            if prints[mode] != prints[next(iter(prints))]:
                                raise SystemExit(f"seed {seed}: mode {mode} does not share "
                                                 f"the split, w_0 and speeds of the others")
                            cfg = RunConfig.parse({**raw, "output-dir": "/tmp/unused"})
                            per_flush[mode] = (cfg.async_buffer_size
                                               if cfg.schedule.rounds == "async" else m)
                            out = Path(tmp) / f"{sp.replace(':', '_')}-{method}-{seed}-{mode}"
                            old = saved.get(key, {}).get(str(seed), {}).get(mode)
                            rows = old if old is not None else one_run(raw, out, stop)
                            results.setdefault(key, {}).setdefault(str(seed), {})[mode] = rows
                            print(f"# {key} seed {seed} {mode}: final acc "
                                  f"{rows[-1]['test-acc']:.4f} sim {rows[-1]['sim-time']:.1f}s "
                                  f"({time.monotonic() - t0:.0f}s wall so far); "
                                  f"{participation(rows, base, seed, sp)}", flush=True)
                            if a.out is not None:  # after every run: a killed bench keeps
                                a.out.write_text(json.dumps(results))  # the finished ones
                        if a.paired_csv is not None and "sync" in modes:
                            write_paired(paired_rows(key, str(seed), results[key][str(seed)],
                                                     a.target, per_flush, m, prints),
                                         a.paired_csv)
    if a.rows is not None:  # the saved --out files carry who trained (a --csv file does not)
        for key, seeds in results.items():
            sp, method = key.split("|")
            task = {"task-time": "task"} if sp.endswith("/task") else {}
            for seed, runs in seeds.items():
                for mode, rows in runs.items():
                    if rows and "clients-trained" in rows[0]:
                        who = participation(rows, {**base, **task}, int(seed),
                                            sp.removesuffix("/task"))
                        print(f"# {key} seed {seed} {mode}: {who}")
    if a.rows is not None and a.paired_csv is not None:  # every saved mode at K = m per flush
        m = max(1, round(a.fraction * a.clients))
        for key, seeds in results.items():
            for seed, runs in seeds.items():
                if "sync" in runs:
                    write_paired(paired_rows(key, seed, runs, a.target, dict.fromkeys(runs, m),
                                             m, dict.fromkeys(runs, "-")), a.paired_csv)
    print(label)
    print(table(results, a.target))
    if a.plot is not None:
        plot(results, a.plot, a.target, label)
    if a.csv is not None:
        write_csv(results, a.csv)


CSV_HEAD = ("device-speeds", "method", "seed", "mode", "round", "sim-time", "test-acc")


def write_csv(results: dict[str, Any], path: Path) -> None:
    """Every evaluated point of every run, one line each (``CSV_HEAD``; csv's CRLF lines)."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(CSV_HEAD)
        for key, seeds in results.items():
            speeds, method = key.split("|")
            for seed, runs in seeds.items():
                for mode, rows in runs.items():
                    out.writerows([speeds, method, seed, mode, r["round"],
                                   f"{r['sim-time']:.4f}", f"{r['test-acc']:.4f}"]
                                  for r in rows if r["test-acc"] is not None)


def csv_rows(path: Path) -> dict[str, Any]:
    """What ``write_csv`` wrote, as saved rows (the evaluated rows only)."""
    out: dict[str, Any] = {}
    with path.open(newline="") as f:
        head, *lines = list(csv.reader(f))
    if tuple(head) != CSV_HEAD:
        raise SystemExit(f"--rows {path}: header {','.join(head)!r} is not "
                         f"{','.join(CSV_HEAD)}")
    for speeds, method, seed, mode, rnd, sim, acc in lines:
        out.setdefault(f"{speeds}|{method}", {}).setdefault(seed, {}).setdefault(
            mode, []).append({"round": int(rnd), "sim-time": float(sim),
                              "test-acc": float(acc)})
    return out


if __name__ == "__main__":
    main()
