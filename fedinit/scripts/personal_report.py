"""The personalized-evaluation table of a sweep: per method and data set, the
global model's central test accuracy and the mean / p10 / min over clients of (a) the global,
(b) the fine-tuned and (c) the own model's accuracy on the clients' local tests, each as
mean +- std over seeds, at the last personalized evaluation. A data set is the Dirichlet
coefficient, or with ``num-regimes`` the regimes and their split; for it a second table gives
each kind's mean per regime (the run's regimes.csv joined with personal_clients.csv).

    .venv/bin/python -m fedinit.scripts.personal_report experiments/fmnist-personal.yaml \
        --cells DIR [--runs RUN_DIR ...] [--csv FILE]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from fedinit.cli.report import CellResult, collect, mean_std
from fedinit.cli.run_files import read_json
from fedinit.cli.sweep_plan import Cell, load_plan
from fedinit.config.defaults import load_defaults
from fedinit.methods.registry import METHODS
from server_app.regime_files import read_regimes
from server_app.results import read_personal_clients
from strategies.personal_summary import KINDS, STATS

COLUMNS: tuple[str, ...] = ("test-acc", *(f"local-{k}-{s}" for k in KINDS for s in STATS))
HEADER: tuple[str, ...] = ("global (central test)",
                           *(f"({'abc'[i]}) {s}" for i in range(len(KINDS)) for s in STATS))


def last_personal(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The last row with a personalized evaluation and the last central accuracy."""
    personal = [r for r in rows if r.get("local-global-mean") is not None]
    accs = [r for r in rows if r.get("test-acc") is not None]
    return {**(personal[-1] if personal else {}),
            "test-acc": accs[-1]["test-acc"] if accs else None}


def cell_values(res: CellResult) -> dict[str, float | None]:
    row = last_personal(res.rows)
    return {c: (None if row.get(c) is None else 100 * float(row[c])) for c in COLUMNS}


def fmt(values: list[float]) -> str:
    if not values:
        return "–"
    mean, std = mean_std(values)
    return f"{mean:.1f}" if std is None else f"{mean:.1f} ± {std:.1f}"


def row_label(config: dict[str, Any]) -> str:
    """The method's label; a graph method's says which graph it ran on (its ``graph`` key:
    ``file:...`` = given, else learned), so the two are separate rows."""
    label = METHODS[config["method"]].label_with(config["beta"])
    graph = config.get("graph")
    if config["method"] == "fedrelax" and isinstance(graph, str):
        label += " (given graph" if graph.startswith("file:") else f" (learned graph: {graph}"
        if not graph.startswith("file:"):  # the learned graph's settings, when not defaults
            for key, name in (("graph-k", "k"), ("graph-refresh-every", "refresh every")):
                value = int(config.get(key, load_defaults()[key]))
                label += f", {name} {value}" if value != load_defaults()[key] else ""
        warmup = int(config.get("relax-warmup", 0))
        label += f", warm-up {warmup}" if warmup else ""
        step = float(config.get("relax-server-step", 0.0))
        if step > 0:  # issue 45: the server's neighbourhood steps
            label += f", server step {config.get('relax-server-rule', 'mean')} {step:g}"
        alpha = float(config.get("fedrelax-alpha", 0.1))
        label += f", alpha {alpha:g}" if alpha != 0.1 else ""  # 0.1: the default, unnamed
        serve = str(config.get("relax-serve", "mean"))
        label += f", serve {serve}" if serve != "mean" else ""  # what (a) scores
        train = str(config.get("relax-train", "gtv"))
        label += f", train {train}" if train != "gtv" else ""  # what trains after the warm-up
        if str(config.get("relax-groups-by", "graph")) == "loss":  # the groups' membership
            label += " by loss"
            for key, name in (("relax-group-margin", "margin"), ("relax-group-split", "split")):
                value = float(config.get(key, load_defaults()[key]))
                label += f", {name} {value:g}" if value != load_defaults()[key] else ""
        label += ")"
    serve = config.get("cluster-serve", "assigned")
    if config["method"] == "clustered" and serve != "assigned":  # what (a) scores
        label += f" (serve {serve})"
    return label


def given_runs(run_dirs: list[Path]) -> list[CellResult]:
    """Finished run directories named on the command line (cells run with ``--set``, which
    the grid's cell ids do not find, e.g. FedRelax on a per-seed graph file), each as a cell
    of its own config."""
    out = []
    for run in run_dirs:
        summary = read_json(run / "summary.json")
        if summary is None or "config" not in summary:
            raise SystemExit(f"--runs {run}: no summary.json with a config (not a finished "
                             "run directory)")
        config = summary["config"]
        cell = Cell(id=run.name, overrides={}, coords={}, config=config)
        rows = [json.loads(x) for x in (run / "rounds.jsonl").read_text().splitlines()
                if x.strip()]
        out.append(CellResult(cell, run_dir=run, summary=summary, rows=rows))
    return out


def data_key(config: dict[str, Any]) -> tuple[int, str, str, float]:
    """What a cell's data set is: (regimes, regime kind, partition, Dirichlet alpha)."""
    return (int(config.get("num-regimes", 0)), str(config.get("regime-kind", "")),
            str(config["partition"]), float(config["dirichlet-alpha"]))


def data_label(key: tuple[int, str, str, float]) -> str:
    """'Dir-0.1', or '4 rotate regimes, iid' / '..., Dir-0.1' for a regimes data set."""
    regimes, kind, partition, alpha = key
    split = f"Dir-{alpha:g}" if partition.startswith("dirichlet") or not regimes else partition
    return f"{regimes} {kind} regimes, {split}" if regimes else split


def regime_values(res: CellResult) -> dict[str, float | None]:
    """Per regime, the mean over its clients of each kind's accuracy (%) at the last
    personalized evaluation: ``r{regime}-{kind}`` ({} for a run without regimes)."""
    if res.run_dir is None:
        return {}
    regimes = read_regimes(res.run_dir)
    if not regimes:
        return {}
    out: dict[str, float | None] = {}
    clients = read_personal_clients(res.run_dir)
    for regime in range(int(res.cell.config.get("num-regimes", 0))):
        for kind in KINDS:
            accs = [100 * float(r[f"acc-{kind}"]) for r in clients
                    if regimes.get(int(r["partition-id"])) == regime
                    and r.get(f"acc-{kind}") not in (None, "")]
            out[f"r{regime}-{kind}"] = math.fsum(accs) / len(accs) if accs else None
    return out


def _table(title: str, header: list[str], rows: list[tuple[str, list[dict[str, Any]]]],
           columns: list[str]) -> list[str]:
    lines = [title, "", "| method | seeds | " + " | ".join(header) + " |",
             "|---|---:|" + "---:|" * len(header)]
    for label, cells in rows:
        if cells:
            body = [fmt([v for cell in cells if (v := cell.get(c)) is not None])
                    for c in columns]
            lines.append(f"| {label} | {len(cells)} | " + " | ".join(body) + " |")
    return [*lines, ""]


def tables(results: list[CellResult]) -> tuple[str, list[dict[str, Any]]]:
    """The markdown tables (one per data set, and per regime for a regimes data set) and
    one CSV row per cell."""
    groups: dict[tuple[tuple[int, str, str, float], str], list[dict[str, Any]]] = (
        defaultdict(list))
    labels: dict[str, None] = {}
    flat = []
    any_regimes = any(r.done and r.cell.config.get("num-regimes") for r in results)
    for res in results:
        if not res.done:
            continue
        c = res.cell.config
        label = row_label(c)
        labels[label] = None
        vals: dict[str, Any] = {**cell_values(res), **regime_values(res)}
        key = data_key(c)
        groups[(key, label)].append(vals)
        data = ({"data": data_label(key), "partition": c["partition"],
                 "num-regimes": key[0], "regime-kind": key[1]} if any_regimes else {})
        flat.append({"method": label, **data, "dirichlet-alpha": c["dirichlet-alpha"],
                     "seed": c["seed"], **{k: vals.get(k) for k in COLUMNS},
                     **({k: v for k, v in vals.items() if k not in COLUMNS})})
    lines: list[str] = []
    for key in sorted({k for k, _ in groups}):
        rows = [(label, groups.get((key, label), [])) for label in labels]
        lines += _table(f"{data_label(key)} (mean ± std over seeds; accuracies in %)",
                        list(HEADER), rows, list(COLUMNS))
        if key[0]:
            regime_cols = [f"r{r}-{kind}" for kind in KINDS for r in range(key[0])]
            header = [f"({'abc'[i]}) regime {r}" for i in range(len(KINDS))
                      for r in range(key[0])]
            lines += _table(f"{data_label(key)}, per regime: mean over the regime's clients "
                            "(mean ± std over seeds; accuracies in %)", header, rows,
                            regime_cols)
    if flat:
        names = list(dict.fromkeys(k for row in flat for k in row))
        flat = [{k: row.get(k) for k in names} for row in flat]
    return "\n".join(lines), flat


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("grid", type=Path, nargs="?")
    ap.add_argument("--cells", type=Path)
    ap.add_argument("--runs", type=Path, nargs="+", default=[],
                    help="finished run directories to add (cells run with --set)")
    ap.add_argument("--csv", type=Path, help="also write one line per finished cell here")
    args = ap.parse_args(argv)
    if (args.grid is None) != (args.cells is None) or (args.grid is None and not args.runs):
        ap.error("give a grid with --cells, --runs, or both")
    results = [] if args.grid is None else collect(load_plan(args.grid), args.cells.resolve())
    text, flat = tables(results + given_runs(args.runs))
    print(text)
    if args.csv is not None and flat:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(flat[0]))
            writer.writeheader()
            writer.writerows(flat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
