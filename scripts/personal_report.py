"""The personalized-evaluation table of a sweep: per method and Dirichlet coefficient, the
global model's central test accuracy and the mean / p10 / min over clients of (a) the global,
(b) the fine-tuned and (c) the own model's accuracy on the clients' local tests, each as
mean +- std over seeds, at the last personalized evaluation.

    .venv/bin/python -m scripts.personal_report experiments/fmnist-personal.yaml \
        --cells DIR [--csv FILE]
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from methods.registry import METHODS
from scripts.report import CellResult, collect, mean_std
from scripts.sweep_plan import load_plan
from server_app.personal_summary import KINDS, STATS

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


def tables(results: list[CellResult]) -> tuple[str, list[dict[str, Any]]]:
    """The markdown tables (one per Dirichlet coefficient) and one CSV row per cell."""
    groups: dict[tuple[float, str], list[dict[str, float | None]]] = defaultdict(list)
    labels: dict[str, None] = {}
    flat = []
    for res in results:
        if not res.done:
            continue
        c = res.cell.config
        label = METHODS[c["method"]].label_with(c["beta"])
        labels[label] = None
        vals = cell_values(res)
        groups[(c["dirichlet-alpha"], label)].append(vals)
        flat.append({"method": label, "dirichlet-alpha": c["dirichlet-alpha"],
                     "seed": c["seed"], **vals})
    lines = []
    for alpha in sorted({a for a, _ in groups}):
        lines += [f"Dir-{alpha:g} (mean ± std over seeds; accuracies in %)", "",
                  "| method | seeds | " + " | ".join(HEADER) + " |",
                  "|---|---:|" + "---:|" * len(HEADER)]
        for label in labels:
            cells = groups.get((alpha, label), [])
            if cells:
                body = [fmt([v for cell in cells if (v := cell[c]) is not None])
                        for c in COLUMNS]
                lines.append(f"| {label} | {len(cells)} | " + " | ".join(body) + " |")
        lines.append("")
    return "\n".join(lines), flat


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("grid", type=Path)
    ap.add_argument("--cells", type=Path, required=True)
    ap.add_argument("--csv", type=Path, help="also write one line per finished cell here")
    args = ap.parse_args(argv)
    plan = load_plan(args.grid)
    text, flat = tables(collect(plan, args.cells.resolve()))
    print(text)
    if args.csv is not None and flat:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(flat[0]))
            writer.writeheader()
            writer.writerows(flat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
