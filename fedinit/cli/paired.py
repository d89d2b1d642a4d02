"""Paired comparisons of two modes over seeds: the difference's mean and its 95% interval.

Seeds differ by several points at the sizes these machines run (docs/reproduction.md), so
two modes are compared on the SAME seeds (same split, initial model and device speeds) and
the per-seed differences are what is summarised: d_s = metric(B, s) - metric(A, s), their
mean and the two-sided Student-t interval mean +- t_{0.975, n-1} * sd / sqrt(n). A seed
that only one mode has is left out and named (never paired with another seed).

    .venv/bin/fedinit-report paired RESULTS.csv --by mode --a sync --b async \
        --metric test-acc [--where round=40 --where method=fedinit] [--pair-on seed] \
        [--stat diff|ratio] [--metric-a COLUMN]

``--stat ratio`` summarises r_s = metric(B, s) / metric_a(A, s) instead (its mean and the
same t interval over the seeds): e.g. the accepted updates async needed to reach sync's final
accuracy over sync's own updates (``--metric updates-to-sync-final --metric-a
sync-updates``, ``bench/async_speed.py --paired-csv``), or sync's time to a target over
async's (``--a async --b sync --metric t-to-target``). ``--metric-a`` names A's column when
it is not ``--metric``.

A row is one run's figure: the CSV holds every seed (e.g. ``bench/async_speed.py --csv``
or a sweep's ``results.csv``); ``--where`` keeps the rows whose column equals the value.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

from fedinit.cli.refusals import refuses, refusing

CONFIDENCE = 0.95


class PairError(ValueError):
    """A paired comparison that cannot be made; one line naming the value."""


@dataclass(frozen=True)
class Paired:
    """B - A over the seeds both have."""

    keys: tuple[str, ...]
    """The pairing key of each difference (e.g. the seed), in the order of ``diffs``."""
    diffs: tuple[float, ...]
    unpaired: tuple[str, ...]
    """Pairing keys only one mode has (left out)."""

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.diffs)

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """The two-sided Student-t interval of the mean difference (needs n >= 2)."""
        if self.n < 2:
            raise PairError(f"{self.n} paired seed(s) is not allowed for an interval; "
                            "allowed: at least 2")
        half = stats.t.ppf(0.5 + confidence / 2, self.n - 1) * statistics.stdev(self.diffs) \
            / math.sqrt(self.n)
        return self.mean - half, self.mean + half


STATS = ("diff", "ratio")
"""What one seed's pair becomes: B - A, or B / A."""


def pair(rows: Iterable[Mapping[str, str]], by: str, a: str, b: str, metric: str,
         pair_on: Sequence[str] = ("seed",), stat: str = "diff",
         metric_a: str | None = None, drop_nan: bool = False) -> Paired:
    """B - A (``stat`` ``ratio``: B / A) of ``metric`` (A's: ``metric_a``, default the same
    column) for each value of ``pair_on`` both modes (column ``by``) have; two rows of one
    mode with the same key are refused (the grid is ambiguous), so is a ratio over A = 0.
    ``drop_nan``: a NaN value (a target never reached) leaves its seed out, named."""
    if stat not in STATS:
        raise PairError(f"--stat {stat!r} is not allowed; allowed: {' | '.join(STATS)}")
    if a == b:
        raise PairError(f"--a and --b are both {a!r}; allowed: two different modes")
    column = {a: metric_a or metric, b: metric}
    side: dict[str, dict[tuple[str, ...], float]] = {a: {}, b: {}}
    for row in rows:
        mode = row.get(by)
        if mode not in side:
            continue
        metric = column[mode]
        missing = [c for c in (metric, *pair_on) if c not in row]
        if missing:
            raise PairError(f"column {missing[0]!r} is not in the rows; allowed: "
                            f"{', '.join(sorted(row))}")
        key = tuple(str(row[c]) for c in pair_on)
        if key in side[mode]:
            raise PairError(f"{by}={mode!r} has two rows for {'/'.join(pair_on)}={key}; "
                            "allowed: one per seed (narrow it with --where)")
        value = float(row[metric])
        if math.isnan(value) and drop_nan:
            continue  # e.g. a time to a target the run never reached: that seed is unpaired
        side[mode][key] = value
    both = sorted(set(side[a]) & set(side[b]), key=_natural)
    if stat == "ratio":
        zero = [k for k in both if side[a][k] == 0.0]
        if zero:
            raise PairError(f"{by}={a!r} has {column[a]}=0 for {'/'.join(pair_on)}="
                            f"{'/'.join(zero[0])}; allowed: a non-zero A for --stat ratio")
    return Paired(keys=tuple("/".join(k) for k in both),
                  diffs=tuple(side[b][k] / side[a][k] if stat == "ratio"
                              else side[b][k] - side[a][k] for k in both),
                  unpaired=tuple("/".join(k) for k in sorted(set(side[a]) ^ set(side[b]),
                                                              key=_natural)))


def _natural(key: tuple[str, ...]) -> tuple[tuple[int, float | str], ...]:
    """Seeds in numeric order (2 before 10)."""
    out: list[tuple[int, float | str]] = []
    for part in key:
        try:
            out.append((0, float(part)))
        except ValueError:
            out.append((1, part))
    return tuple(out)


def where(rows: Iterable[Mapping[str, str]], conditions: Sequence[str]) -> list[dict[str, str]]:
    """The rows whose columns equal every ``COLUMN=VALUE`` condition."""
    wanted: list[tuple[str, str]] = []
    for cond in conditions:
        column, sep, value = cond.partition("=")
        if not sep or not column:
            raise PairError(f"--where {cond!r} is not allowed; allowed: COLUMN=VALUE")
        wanted.append((column, value))
    return [dict(r) for r in rows if all(r.get(c) == v for c, v in wanted)]


def report(p: Paired, a: str, b: str, metric: str, stat: str = "diff",
           metric_a: str | None = None) -> str:
    """The comparison as a person reads it: one line per seed, then the summary."""
    of_a = f"{a} ({metric_a})" if metric_a and metric_a != metric else a
    lines = [f"{metric}: {b} {'/' if stat == 'ratio' else '-'} {of_a}, paired by seed"]
    lines += [f"  {k:>8}  {d:+.4f}" for k, d in zip(p.keys, p.diffs, strict=True)]
    if p.unpaired:
        lines.append(f"  left out (only one mode has them): {', '.join(p.unpaired)}")
    low, high = p.interval()
    lines.append(f"mean {p.mean:+.4f}, {CONFIDENCE:.0%} interval [{low:+.4f}, {high:+.4f}] "
                 f"over {p.n} seeds")
    return "\n".join(lines)


@refuses("fedinit-report paired")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fedinit-report paired", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", type=Path)
    ap.add_argument("--by", required=True, help="the column naming the mode")
    ap.add_argument("--a", required=True, help="the baseline mode")
    ap.add_argument("--b", required=True, help="the mode compared to it (B - A)")
    ap.add_argument("--metric", required=True)
    ap.add_argument("--where", action="append", default=[], metavar="COLUMN=VALUE")
    ap.add_argument("--pair-on", action="append", metavar="COLUMN",
                    help="what pairs two rows (default: seed)")
    ap.add_argument("--stat", default="diff", help="diff (B - A) | ratio (B / A)")
    ap.add_argument("--metric-a", default=None, metavar="COLUMN",
                    help="A's column when it is not --metric")
    ap.add_argument("--drop-nan", action="store_true",
                    help="leave out a seed whose value is NaN (e.g. a target not reached)")
    args = ap.parse_args(argv)
    with refusing(PairError, OSError):
        with args.csv.open(newline="") as f:
            rows = where(csv.DictReader(f), args.where)
        print(report(pair(rows, args.by, args.a, args.b, args.metric,
                          tuple(args.pair_on or ("seed",)), args.stat, args.metric_a,
                          args.drop_nan),
                     args.a, args.b, args.metric, args.stat, args.metric_a))
    return 0


if __name__ == "__main__":
    sys.exit(main())
