"""The one command line of the per-run report builders (cluster purity, graph purity, K rules,
participation): the run directories to report on, one or more."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path


def run_dirs(doc: str | None, argv: list[str] | None = None,
             what: str = "run directories") -> list[Path]:
    """The run directories named on the command line (``argv``; None: sys.argv), with the
    report's first docstring line as its description."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0] if doc else None)
    ap.add_argument("runs", nargs="+", type=Path, help=what)
    return list(ap.parse_args(argv).runs)


def print_reports(doc: str | None, argv: list[str] | None,
                  report: Callable[[Path], str]) -> int:
    """A one-report-per-run builder's ``main``: ``report(run)`` printed for each run directory
    on the command line (``run_dirs``); the exit status 0."""
    for run_dir in run_dirs(doc, argv):
        print(report(run_dir))
    return 0
