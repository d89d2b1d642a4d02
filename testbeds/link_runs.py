"""One `flwr run` against a ``LinkDeployment``, watched round by round: the scenario's cut
made when its round starts, the proxies' bytes read at every new row, the rows and the
status at the end. The slow link tests and ``bench/link_rounds.py`` both drive runs so."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedinit.cli.run_dirs import read_rows
from testbeds.deployment_runs import FlwrRun
from testbeds.link_deployment import LinkDeployment


@dataclass
class Watched:
    """What a watched run did."""

    status: str
    rows: list[dict[str, Any]]
    round_bytes: list[tuple[int, int]]
    """(up, down) bytes through the proxies between one row and the next (round 1: from the
    run's start, so the FAB and the identity queries are in it)."""
    cuts: dict[int, float] = field(default_factory=dict)
    """{node: seconds into the run its link was cut}."""
    log: str = ""
    wall: float = 0.0
    proxy: dict[str, int] = field(default_factory=dict)
    """The proxies' counters over this run (resets, held chunks, bytes black-holed)."""

    def seconds_per_round(self, skip_first: bool = True) -> float:
        """Median ``round-seconds`` (round 1 left out: it pays the start-up)."""
        rows = self.rows[1:] if skip_first and len(self.rows) > 1 else self.rows
        return statistics.median(float(r["round-seconds"]) for r in rows)

    def bytes_per_round(self) -> tuple[float, float]:
        """Median (up, down) bytes of the rounds after the first."""
        later = self.round_bytes[1:] or self.round_bytes
        return (statistics.median(b[0] for b in later), statistics.median(b[1] for b in later))


def rows_of(out: Path) -> list[dict[str, Any]]:
    """The rows written so far under ``out`` (none before the run directory exists; a line
    being written is skipped: fedinit/cli/run_dirs.py's ``read_rows``)."""
    return [row for f in out.glob("*/rounds.jsonl") for row in read_rows(f)]


def watch(dep: LinkDeployment, name: str, cfg: dict[str, Any], out: Path,
          timeout: float = 240.0) -> Watched:
    """Run ``cfg`` to its end; each node whose scenario has a cut loses its link for
    ``cut_seconds`` once the row of round ``cut_from_round - 1`` is written (as that round
    starts)."""
    t0 = time.monotonic()
    before = counters(dep)
    run = FlwrRun(dep, name, {**cfg, "output-dir": str(out)})
    cuts: dict[int, float] = {}
    per_round: list[tuple[int, int]] = []
    last = dep.wire_bytes()
    try:
        run.run_id()
        deadline = t0 + timeout
        while run.popen.poll() is None:
            assert time.monotonic() < deadline, (f"run {name} not done within {timeout:g}s:\n"
                                                 + run.text()[-3000:])
            n = len(rows_of(out))
            while len(per_round) < n:
                now = dep.wire_bytes()
                per_round.append((now[0] - last[0], now[1] - last[1]))
                last = now
            for i in dep.proxies:
                sc = dep.scenario(i)
                if sc.cut_from_round and i not in cuts and n >= sc.cut_from_round - 1:
                    dep.cut(i, sc.cut_seconds)
                    cuts[i] = time.monotonic() - t0
            time.sleep(0.1)
        status = run.wait(60)
    finally:
        run.stop()
    rows = rows_of(out)
    if len(per_round) < len(rows):
        now = dep.wire_bytes()
        per_round.append((now[0] - last[0], now[1] - last[1]))
    totals = {k: v - before.get(k, 0) for k, v in counters(dep).items()}
    return Watched(status, rows, per_round, cuts, run.text(), time.monotonic() - t0, totals)


def counters(dep: LinkDeployment) -> dict[str, int]:
    """The proxies' counters summed (since the deployment came up)."""
    totals: dict[str, int] = {}
    for proxy in dep.proxies.values():
        for key, value in vars(proxy.counters).items():
            totals[key] = totals.get(key, 0) + value
    return totals
