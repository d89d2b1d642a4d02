"""A sweep's results as the paper lays them out: tables (results.csv, results.md) and curves.

Rows are methods and their +RI versions, columns are participation x Dirichlet coefficient,
and each entry is the mean +- std over seeds of the paper's metric (the smoothed peak test
accuracy). Only finished cells count; a cell is finished when its run directory has a
summary.json whose config matches the cell (so a changed grid never reports stale runs).

    .venv/bin/fedinit-report experiments/fmnist-table6.yaml --out DIR
    .venv/bin/fedinit-report paired RESULTS.csv --by mode --a sync --b async --metric test-acc

``paired``: two modes on the same seeds, the mean difference and its 95% interval
(``fedinit/cli/paired.py``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedinit.cli.refusals import refuses, refusing
from fedinit.cli.run_files import read_json
from fedinit.cli.sweep_plan import Cell, PlanError, SweepPlan, load_plan, matches
from fedinit.cli.time_to_target import NOT_REACHED, TargetHit, first_reaching, summarize
from fedinit.methods.registry import METHODS
from server_app.results import ACCURACY_LABEL, DIVERGENCE_LABEL, smoothed_peak

SECTION_KEYS: tuple[str, ...] = ("model", "dataset", "local-epochs")
CSV_FIELDS: tuple[str, ...] = (
    "cell-id", "status", "method", "beta", "model", "dataset", "partition", "dirichlet-alpha",
    "num-clients", "fraction-train", "seed", "local-epochs", "num-server-rounds", "rounds",
    "metric", "smoothed-peak-acc", "final-test-acc", "best-test-acc", "wall-seconds",
    "mean-round-seconds", "run-dir")
TARGET_FIELDS: tuple[str, ...] = ("target-round", "target-seconds")
"""results.csv columns added (before run-dir) when the grid's metric has a target."""
PENDING = "–"


@dataclass
class CellResult:
    """A cell and, once it finished, its run directory, summary and per-round rows."""

    cell: Cell
    run_dir: Path | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    metric: float | None = None
    target: TargetHit | None = None  # when the grid has metric.target and the run reached it

    @property
    def done(self) -> bool:
        return self.run_dir is not None


# --------------------------------------------------------------------------- finding runs
def run_dirs(cell_dir: Path) -> list[Path]:
    """The run directories simulate.py left in a cell directory (hidden ones excluded)."""
    if not cell_dir.is_dir():
        return []
    return sorted(p for p in cell_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def finished_run(cell_dir: Path, cell: Cell) -> Path | None:
    """The run directory holding this cell's finished run (all rounds, same config), if any."""
    for run in reversed(run_dirs(cell_dir)):
        summary = read_json(run / "summary.json")
        if (summary is not None and summary.get("rounds") == cell.config["num-server-rounds"]
                and matches(summary.get("config", {}), cell)):
            return run
    return None


def _read_rows(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [json.loads(x) for x in lines if x.strip()]


def collect(plan: SweepPlan, cells_dir: Path) -> list[CellResult]:
    """Every cell of the grid with its results where it finished."""
    out = []
    for cell in plan.cells:
        res = CellResult(cell)
        run = finished_run(cells_dir / cell.id, cell)
        if run is not None:
            res.run_dir = run
            res.summary = read_json(run / "summary.json") or {}
            res.rows = _read_rows(run / "rounds.jsonl")
            res.metric = metric_of(res.summary, res.rows, plan.metric)
            if plan.target is not None:
                res.target = first_reaching(res.rows, plan.target,
                                            plan.metric.get("window", 5))
        out.append(res)
    return out


def metric_of(summary: dict[str, Any], rows: Sequence[dict[str, Any]],
              metric: dict[str, int]) -> float | None:
    """The paper's smoothed peak: from the summary, or recomputed with the grid's window."""
    if not metric:
        value = summary.get("smoothed-peak-acc")
        return None if value is None else float(value)
    accs = [float(r["test-acc"]) for r in rows if r.get("test-acc") is not None]
    if not accs:
        return None
    return smoothed_peak(accs, window=metric.get("window", 5), last=metric.get("last", 50))


# --------------------------------------------------------------------------- layout
def row_key(config: dict[str, Any]) -> tuple[str, float]:
    return str(config["method"]), float(config["beta"])


def col_key(config: dict[str, Any]) -> tuple[float, int, float]:
    return float(config["fraction-train"]), int(config["num-clients"]), \
        float(config["dirichlet-alpha"])


def col_label(key: tuple[float, int, float]) -> str:
    fraction, clients, alpha = key
    return f"{100 * fraction:g}%-{clients} Dir-{alpha:g}"


def row_labels(keys: Iterable[tuple[str, float]]) -> dict[tuple[str, float], str]:
    """FedAvg/FedInit and X/X+RI; with the beta spelled out where a method has several."""
    keys = list(keys)
    betas: dict[str, set[float]] = {}
    for method, beta in keys:
        betas.setdefault(method, set()).add(beta)
    labels = {}
    for method, beta in keys:
        spec = METHODS.get(method)
        name = spec.label_with(beta) if spec else method
        nonzero = {b for b in betas[method] if b}
        if len(nonzero) > 1:
            name += f" (β={beta:g})"
        labels[(method, beta)] = name
    return labels


def section_of(config: dict[str, Any], plan: SweepPlan) -> str:
    """The sub-table a cell belongs to (one per model/dataset the grid varies)."""
    parts = [f"{k}={config[k]}" for k in SECTION_KEYS if k in plan.axes]
    return ", ".join(parts) or "all"


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (ddof=1; None for a single value)."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def fmt(values: Sequence[float], expected: int) -> str:
    """'78.77 ± 0.11' in percent; '(2/3)' when seeds are missing; '–' when none finished."""
    if not values:
        return PENDING
    mean, std = mean_std([100 * v for v in values])
    text = f"{mean:.2f}" if std is None else f"{mean:.2f} ± {std:.2f}"
    return text if len(values) == expected else f"{text} ({len(values)}/{expected})"


@dataclass
class Table:
    """One section of results: row labels x column labels of metric lists."""

    title: str
    columns: list[tuple[float, int, float]]
    rows: list[tuple[str, float]]
    values: dict[tuple[tuple[str, float], tuple[float, int, float]], list[float]]
    expected: dict[tuple[tuple[str, float], tuple[float, int, float]], int]
    results: list[CellResult]


def tables(plan: SweepPlan, results: Sequence[CellResult]) -> list[Table]:
    """Results grouped into sections, rows and columns in the grid's order."""
    out: dict[str, Table] = {}
    for res in results:
        cfg = res.cell.config
        title = section_of(cfg, plan)
        t = out.setdefault(title, Table(title, [], [], {}, {}, []))
        r, c = row_key(cfg), col_key(cfg)
        if r not in t.rows:
            t.rows.append(r)
        if c not in t.columns:
            t.columns.append(c)
        t.expected[(r, c)] = t.expected.get((r, c), 0) + 1
        t.results.append(res)
        if res.metric is not None and math.isfinite(res.metric):
            t.values.setdefault((r, c), []).append(res.metric)
    return list(out.values())


def _md_table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return lines


def markdown(plan: SweepPlan, results: Sequence[CellResult], command: str) -> str:
    """results.md: the metric table(s), RI gains, seconds per round, settings, command."""
    done = sum(r.done for r in results)
    window, last = plan.metric.get("window", 5), plan.metric.get("last", 50)
    lines = [f"# {plan.name}", ""]
    if plan.description:
        lines += [plan.description, ""]
    lines += [f"Reproduce: `{command}`", "",
              f"Cells finished: {done} / {len(results)}. Entries: smoothed peak test accuracy "
              f"(max over the last {last} evaluated rounds of the {window}-point moving average), "
              "%, "
              "mean ± sample std over seeds; (k/n) = only k of n seeds finished.", ""]
    for t in tables(plan, results):
        labels = row_labels(t.rows)
        lines += [f"## {t.title}", ""]
        header = ["Method", *(col_label(c) for c in t.columns)]
        body = [[labels[r], *(fmt(t.values.get((r, c), []), t.expected.get((r, c), 0))
                              if (r, c) in t.expected else "" for c in t.columns)]
                for r in t.rows]
        lines += _md_table(header, body) + [""]
        gains = _ri_gains(t)
        if gains:
            lines += ["RI gain (+RI minus the plain method, percentage points of the means):", ""]
            lines += _md_table(header, gains) + [""]
        if plan.target is not None:
            lines += [f"Rounds / wall seconds to reach {plan.target:g}% ({window}-point moving "
                      "average of the test accuracy; means over the seeds that reached it):",
                      ""]
            lines += _md_table(header, _to_target(t, labels)) + [""]
        lines += [f"Divergence term (mean over the last {last} rounds, then over seeds):", ""]
        lines += _md_table(header, _divergence(t, labels, last)) + [""]
        lines += ["Seconds per round (mean over finished cells):", ""]
        lines += _md_table(["Method", "s/round", "cells"], _round_seconds(t, labels)) + [""]
    lines += ["## Settings", "", "base: " + _kv(plan.base) + ("  " if plan.base else "")]
    for method, ov in plan.overrides.items():
        lines.append(f"overrides for {method}: " + _kv(ov) + "  ")
    lines += ["grid: " + "; ".join(f"{a}: {v}" for a, v in plan.axes.items()), ""]
    return "\n".join(lines)


def _kv(d: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in d.items())


def _ri_gains(t: Table) -> list[list[str]]:
    labels = row_labels(t.rows)
    body = []
    for method, beta in t.rows:
        base = (method, 0.0)
        if not beta or base not in t.rows:
            continue
        row = [labels[(method, beta)]]
        for c in t.columns:
            on, off = t.values.get(((method, beta), c)), t.values.get((base, c))
            row.append(f"{100 * (statistics.fmean(on) - statistics.fmean(off)):+.2f}"
                       if on and off else PENDING)
        body.append(row)
    return body


def _divergence(t: Table, labels: dict[tuple[str, float], str], last: int) -> list[list[str]]:
    """The paper's consistency term near the end of training, per row and column."""
    body = []
    for r in t.rows:
        row = [labels[r]]
        for c in t.columns:
            means = []
            for x in t.results:
                if x.done and row_key(x.cell.config) == r and col_key(x.cell.config) == c:
                    div = [float(y["divergence"]) for y in x.rows
                           if y.get("divergence") is not None][-last:]
                    if div:
                        means.append(statistics.fmean(div))
            row.append(f"{statistics.fmean(means):.3g}" if means else PENDING)
        body.append(row)
    return body


def _to_target(t: Table, labels: dict[tuple[str, float], str]) -> list[list[str]]:
    """Per row and column: rounds and seconds to the target over the finished seeds."""
    body = []
    for r in t.rows:
        row = [labels[r]]
        for c in t.columns:
            hits = [x.target for x in t.results
                    if x.done and row_key(x.cell.config) == r and col_key(x.cell.config) == c]
            row.append(summarize(hits) or PENDING)
        body.append(row)
    return body


def _round_seconds(t: Table, labels: dict[tuple[str, float], str]) -> list[list[str]]:
    body = []
    for r in t.rows:
        secs = [float(x.summary["mean-round-seconds"]) for x in t.results
                if x.done and row_key(x.cell.config) == r and x.summary.get("mean-round-seconds")]
        body.append([labels[r], f"{statistics.fmean(secs):.2f}" if secs else PENDING,
                     str(len(secs))])
    return body


def write_csv(results: Sequence[CellResult], path: Path, target: float | None = None) -> None:
    """One line per cell: its coordinates, status and numbers (and, with a target, the round
    and seconds that reached it, or 'not reached')."""
    fields = CSV_FIELDS if target is None else (*CSV_FIELDS[:-1], *TARGET_FIELDS, CSV_FIELDS[-1])
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for res in results:
            cfg, s = res.cell.config, res.summary
            hit: dict[str, Any] = {}
            if target is not None and res.done:
                hit = ({"target-round": res.target.round, "target-seconds": res.target.seconds}
                       if res.target else dict.fromkeys(TARGET_FIELDS, NOT_REACHED))
            w.writerow({**{k: cfg.get(k) for k in CSV_FIELDS if k in cfg},
                        "cell-id": res.cell.id, "status": "done" if res.done else "pending",
                        "rounds": s.get("rounds"), "metric": res.metric,
                        "smoothed-peak-acc": s.get("smoothed-peak-acc"),
                        "final-test-acc": s.get("final-test-acc"),
                        "best-test-acc": s.get("best-test-acc"),
                        "wall-seconds": s.get("wall-seconds"),
                        "mean-round-seconds": s.get("mean-round-seconds"),
                        "run-dir": str(res.run_dir or ""), **hit})


# --------------------------------------------------------------------------- plots
def _mean_curve(runs: Sequence[CellResult], key: str) -> tuple[list[int], list[float]]:
    """The per-round mean over seeds of ``key`` (rounds every finished seed has)."""
    per_round: dict[int, list[float]] = {}
    for res in runs:
        for row in res.rows:
            if row.get(key) is not None:
                per_round.setdefault(int(row["round"]), []).append(float(row[key]))
    pts = [(r, statistics.fmean(v)) for r, v in sorted(per_round.items()) if len(v) == len(runs)]
    return [p[0] for p in pts], [p[1] for p in pts]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-").lower()


def plot_curves(plan: SweepPlan, results: Sequence[CellResult], out_dir: Path) -> list[Path]:
    """One PNG per section and column: accuracy and divergence against rounds, per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for t in tables(plan, results):
        labels = row_labels(t.rows)
        for c in t.columns:
            fig, (ax_acc, ax_div) = plt.subplots(1, 2, figsize=(11, 4))
            cmap = plt.get_cmap("tab20" if len(t.rows) > 10 else "tab10")
            drawn = 0
            for i, r in enumerate(t.rows):
                runs = [x for x in t.results if x.done and row_key(x.cell.config) == r
                        and col_key(x.cell.config) == c]
                if not runs:
                    continue
                style = {"color": cmap(i % cmap.N), "linestyle": "--" if r[1] == 0 else "-",
                         "label": f"{labels[r]} (n={len(runs)})", "linewidth": 1.3}
                for ax, key in ((ax_acc, "test-acc"), (ax_div, "divergence")):
                    xs, ys = _mean_curve(runs, key)
                    if xs:
                        ax.plot(xs, [100 * y if key == "test-acc" else y for y in ys], **style)
                drawn += 1
            if not drawn:
                plt.close(fig)
                continue
            ax_acc.set_ylabel(ACCURACY_LABEL)
            ax_div.set_ylabel(DIVERGENCE_LABEL)
            ax_div.set_yscale("log")
            for ax in (ax_acc, ax_div):
                ax.set_xlabel("round")
                ax.grid(alpha=0.3)
            ax_acc.legend(fontsize=7, ncol=2 if drawn > 7 else 1)
            title = f"{plan.name}: {col_label(c)}"
            fig.suptitle(title if t.title == "all" else f"{title}, {t.title}")
            fig.tight_layout()
            name = _slug(col_label(c)) + ("" if t.title == "all" else "-" + _slug(t.title))
            path = out_dir / f"curves-{name}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


def write_report(plan: SweepPlan, results: Sequence[CellResult], out: Path, command: str,
                 plots: bool = True) -> None:
    """results.csv, results.md and (optionally) plots/ under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    write_csv(results, out / "results.csv", plan.target)
    (out / "results.md").write_text(markdown(plan, results, command))
    if plots:
        plot_curves(plan, results, out / "plots")


@refuses("report")
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["paired"]:
        from fedinit.cli import paired

        return paired.main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("grid", type=Path)
    ap.add_argument("--out", type=Path, help="the sweep directory (default outputs/sweeps/NAME)")
    ap.add_argument("--cells", type=Path, help="where the cells live (default OUT/cells)")
    args = ap.parse_args(argv)
    with refusing(PlanError):
        plan = load_plan(args.grid)
    out = args.out or Path("outputs/sweeps") / plan.name
    results = collect(plan, args.cells or out / "cells")
    cells = f" --cells {args.cells}" if args.cells else ""
    write_report(plan, results, out, f"fedinit-sweep {args.grid} --out {out}{cells}")
    print(f"report: {sum(r.done for r in results)}/{len(results)} cells; {out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
