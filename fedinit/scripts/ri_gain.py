"""RI's gain per method over seeds, and whether it is outside the seed-to-seed spread.

    .venv/bin/python -m fedinit.scripts.ri_gain outputs/sweeps/fmnist-table6-seeds/results.csv
    .venv/bin/python -m fedinit.scripts.ri_gain outputs/sweeps/fmnist-local-epochs/results.csv \
        --by local-epochs
    .venv/bin/python -m fedinit.scripts.ri_gain outputs/sweeps/fmnist-participation/results.csv \
        --by num-clients,dirichlet-alpha

Reads a sweep's ``results.csv`` (``fedinit/cli/sweep.py``), pairs each method's RI-off cell
(beta 0) with its RI-on cell (beta > 0) of the same seed and setting (the ``--by`` column,
default ``dirichlet-alpha``), and prints one markdown row per method and setting: mean ±
sample std of the metric without and with RI, the gain of the means, each seed's own gain,
and the verdict. **Outside the spread** means both: the gain is larger than the two rows'
standard deviations added (their ±1 std bands do not overlap), and every seed's own gain
has the gain's sign. Beside it, the paired view (each seed's data split and sampling are
the same with and without RI): the two-sided p-value of scipy's paired t-test over the seeds'
gains. Only seeds finished with and without RI count (n).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections import defaultdict
from pathlib import Path

Key = tuple[str, str]  # method, the setting (the --by column's value)


def paired(rows: list[dict[str, str]], by: str = "dirichlet-alpha",
           ) -> dict[Key, dict[int, tuple[float, float]]]:
    """(method, setting) -> seed -> (metric without RI, with RI), finished pairs only."""
    cells: dict[tuple[str, str, int, bool], float] = {}
    for r in rows:
        if r["status"] != "done" or not r["smoothed-peak-acc"]:
            continue
        setting = " ".join(r[c] for c in by.split(","))
        key = (r["method"], setting, int(r["seed"]), float(r["beta"]) > 0)
        cells[key] = 100 * float(r["smoothed-peak-acc"])
    out: dict[Key, dict[int, tuple[float, float]]] = defaultdict(dict)
    for (method, setting, seed, ri), value in cells.items():
        other = cells.get((method, setting, seed, not ri))
        if ri and other is not None:
            out[(method, setting)][seed] = (other, value)
    return out


def _numbers(setting: str) -> tuple[float | str, ...]:
    return tuple(float(x) if x.replace(".", "", 1).isdigit() else x for x in setting.split())


def spread(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else float("nan")


def paired_p(off: list[float], on: list[float]) -> str:
    """Two-sided p of the paired t-test (scipy), or "-" with fewer than 2 seeds."""
    if len(off) < 2:
        return "-"
    from scipy.stats import ttest_rel

    return f"{float(ttest_rel(on, off).pvalue):.3f}"


def verdict(gain: float, std_off: float, std_on: float, per_seed: list[float]) -> str:
    if len(per_seed) < 2:
        return "one seed: no spread"
    same_sign = all((g > 0) == (gain > 0) and g != 0 for g in per_seed)
    if abs(gain) > std_off + std_on and same_sign:
        return "outside the spread" + (" (RI hurts)" if gain < 0 else "")
    return "within the spread"


def table(pairs: dict[Key, dict[int, tuple[float, float]]], order: list[str],
          by: str = "dirichlet-alpha") -> list[str]:
    lines = [f"| Method | {by} | n | without RI | with RI | gain | per-seed gain | verdict | "
             "paired t-test p |",
             "|---|---|---:|---:|---:|---:|---|---|---:|"]
    for method in order:
        for setting in sorted({a for m, a in pairs if m == method}, key=_numbers, reverse=True):
            seeds = pairs[(method, setting)]
            off = [seeds[s][0] for s in sorted(seeds)]
            on = [seeds[s][1] for s in sorted(seeds)]
            gains = [b - a for a, b in zip(off, on, strict=True)]
            mean_off, mean_on = statistics.mean(off), statistics.mean(on)
            std_off, std_on = spread(off), spread(on)
            gain = mean_on - mean_off
            lines.append(
                f"| {method} | {setting} | {len(seeds)} | {mean_off:.2f} ± {std_off:.2f} | "
                f"{mean_on:.2f} ± {std_on:.2f} | {gain:+.2f} | "
                f"{', '.join(f'{g:+.2f}' for g in gains)} | "
                f"{verdict(gain, std_off, std_on, gains)} | {paired_p(off, on)} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, help="a sweep's results.csv")
    ap.add_argument("--by", default="dirichlet-alpha",
                    help="the results.csv column(s), comma-separated, that tell settings "
                         "apart (default dirichlet-alpha)")
    args = ap.parse_args(argv)
    if not args.results.is_file():
        print(f"ri_gain: {args.results} is not a file", file=sys.stderr)
        return 2
    with args.results.open(newline="") as f:
        rows = list(csv.DictReader(f))
    missing = [c for c in args.by.split(",") if rows and c not in rows[0]]
    if missing:
        print(f"ri_gain: --by {','.join(missing)} is not a column of {args.results}",
              file=sys.stderr)
        return 2
    order = list(dict.fromkeys(r["method"] for r in rows))
    print("\n".join(table(paired(rows, args.by), order, args.by)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
