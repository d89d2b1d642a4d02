"""Run an experiment grid (experiments/*.yaml), one `flwr run` per cell, resumable.

    .venv/bin/fedinit-sweep experiments/fmnist-table6.yaml
    .venv/bin/fedinit-sweep experiments/fmnist-table6.yaml --dry-run
    .venv/bin/fedinit-sweep experiments/fmnist-table6.yaml --only 'fedavg-*'
    .venv/bin/fedinit-sweep GRID --connection fedinit-local   # a running deployment

Every cell is validated before the first one runs. Each runs through fedinit/cli/simulate.py
(Flower's simulation engine) or, with --connection, `flwr run . NAME` against a running
SuperLink; its output goes to OUT/cells/<cell-id>/sweep.log and its results to that directory
(its output-dir), where the progress shown here is read from the run's rounds.jsonl.
A cell whose summary.json exists with a matching config is skipped, so an interrupted sweep
resumes where it stopped. results.csv, results.md and plots/ are rewritten after every cell.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from fedinit.cli.flower_env import REPO, flower_env
from fedinit.cli.refusals import Refused, refuses, refusing
from fedinit.cli.report import collect, finished_run, run_dirs, write_report
from fedinit.cli.run_files import RoundsFollower, RoundsTail
from fedinit.cli.simulate import (
    RUN_ID,
    parse_overrides,
    run_status,
    toml_line,
)
from fedinit.cli.sweep_plan import Cell, PlanError, SweepPlan, load_plan
from fedinit.flower_compat.app_source import staged_app


def hms(seconds: float) -> str:
    seconds = int(max(0.0, seconds))
    h, rem = divmod(seconds, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


@dataclass
class Progress:
    """Times rounds and per-cell overhead (start-up, shutdown) in this invocation for an ETA."""

    total_rounds: int
    total_cells: int
    t0: float = 0.0
    rounds_done: int = 0
    cells_started: int = 0
    _cell_t0: float = 0.0
    _last: float | None = None

    def __post_init__(self) -> None:
        self.t0 = time.monotonic()
        self.overheads: list[float] = []
        self.intervals: list[float] = []

    def start_cell(self) -> None:
        self.cells_started += 1
        self._cell_t0, self._last = time.monotonic(), None

    def round_done(self) -> None:
        now = time.monotonic()
        if self._last is None:
            self.overheads.append(now - self._cell_t0)
        else:
            self.intervals.append(now - self._last)
        self._last = now
        self.rounds_done += 1

    def end_cell(self) -> None:
        if self._last is not None and self.overheads:
            self.overheads[-1] += time.monotonic() - self._last

    def elapsed(self) -> str:
        return hms(time.monotonic() - self.t0)

    def eta(self) -> str:
        """Mean overhead x cells not started + mean round x rounds left."""
        if not self.overheads:
            return "?"
        per_round = sum(self.intervals) / len(self.intervals) if self.intervals else 0.0
        left = (sum(self.overheads) / len(self.overheads)
                * (self.total_cells - self.cells_started)
                + per_round * (self.total_rounds - self.rounds_done))
        return hms(left)


def select(cells: Sequence[Cell], pattern: str | None) -> list[Cell]:
    """Cells whose id matches a glob (a plain word matches as a substring)."""
    if not pattern:
        return list(cells)
    glob = pattern if any(ch in pattern for ch in "*?[") else f"*{pattern}*"
    return [c for c in cells if fnmatch.fnmatchcase(c.id, glob)]


def set_aside_unfinished(cell_dir: Path) -> list[Path]:
    """Move a cell's earlier (interrupted or stale) run directories into .stale/.

    Called only for cells with no finished run, so nothing of value is in the way; nothing is
    deleted either, and the cell then holds the single run directory of its new run.
    """
    moved = []
    for run in run_dirs(cell_dir):
        dest = cell_dir / ".stale" / run.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run), str(dest))
        moved.append(dest)
    return moved


def command_for(cell: Cell, cell_dir: Path, connection: str | None,
                resources: dict[str, float], in_process: bool = False,
                app: Path = REPO) -> list[str]:
    """The command that runs one cell: simulate.py, inprocess_run.py (no Flower engine), or
    `flwr run APP` against a deployment (APP: the app's files,
    ``fedinit/flower_compat/app_source.py``)."""
    overrides = {**cell.overrides, "output-dir": str(cell_dir.resolve())}
    if in_process:
        return [sys.executable, "-m", "fedinit.cli.inprocess_run",
                *(f"{k}={_arg(v)}" for k, v in overrides.items())]
    if connection is None:
        res = [f"--num-cpus-per-client={resources.get('num-cpus-per-client', 1.0):g}",
               f"--num-gpus-per-client={resources.get('num-gpus-per-client', 0.0):g}"]
        return [sys.executable, "-m", "fedinit.cli.simulate", *res,
                *(f"{k}={_arg(v)}" for k, v in overrides.items())]
    cfg_file = cell_dir / "run-config.toml"
    cfg_file.write_text("\n".join(toml_line(k, v) for k, v in overrides.items()) + "\n")
    return ["flwr", "run", str(app), connection, "--run-config", str(cfg_file), "--stream"]


def _arg(value: Any) -> str:
    """A value as simulate.py reads it back with parse_value (strings quoted)."""
    return toml_line("v", value).split(" = ", 1)[1]


@dataclass
class CellRun:
    """What is known of a cell's run while it goes: Flower's run id, then the exit code."""

    run_id: str | None = None
    code: int | None = None


def run_cell(cmd: list[str], env: dict[str, str], log: TextIO, rounds: RoundsTail,
             on_round: Callable[[dict[str, Any]], None], run: CellRun, connection: str) -> None:
    """Run ``cmd``, copy its output to ``log``, call on_round per row that ``rounds`` reads
    from the run's rounds.jsonl, fill in ``run`` (Flower's run id from the CLI's output).

    On an interrupt the Flower run is stopped on the SuperLink before the command is ended
    (an interrupted `flwr run` leaves its run going), then the interrupt goes on.
    """
    with (RoundsFollower(rounds, on_round),  # exits last: its final read sees every round
          subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, bufsize=1, cwd=REPO) as proc):
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if run.run_id is None and (m := RUN_ID.search(line)):
                    run.run_id = m.group(1)
        except KeyboardInterrupt:
            stop_run(env, run.run_id, connection)
            proc.terminate()
            raise
    run.code = proc.returncode


def stop_run(env: dict[str, str], run_id: str | None, connection: str) -> None:
    """Stop a run on the SuperLink: it outlives an interrupted `flwr run` otherwise."""
    if run_id is not None:
        subprocess.run(["flwr", "stop", run_id, connection], env=env, capture_output=True,
                       timeout=120, check=False)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_sweep(plan: SweepPlan, cells: Sequence[Cell], out: Path, cells_dir: Path,
              connection: str | None, command: str, env: dict[str, str],
              in_process: bool = False) -> int:
    """Run every unfinished cell in order; return 0 if all of them finished."""
    todo = [c for c in cells if finished_run(cells_dir / c.id, c) is None]
    print(f"sweep {plan.name}: {len(cells)} cells, {len(cells) - len(todo)} already finished, "
          f"{len(todo)} to run; results in {out}", flush=True)
    prog = Progress(sum(int(c.config["num-server-rounds"]) for c in todo), len(todo))
    failed: list[str] = []
    for i, cell in enumerate(todo, 1):
        cell_dir = cells_dir / cell.id
        cell_dir.mkdir(parents=True, exist_ok=True)
        for moved in set_aside_unfinished(cell_dir):
            print(f"  set aside an unfinished or stale run: {moved}", flush=True)
        t_cell = time.monotonic()
        head = f"[{i}/{len(todo)} {cell.id}]"
        print(f"{head} start | sweep {prog.elapsed()}, ETA {prog.eta()}", flush=True)
        prog.start_cell()

        def on_round(row: dict[str, Any], head: str = head, t: float = t_cell,
                     n: int = int(cell.config["num-server-rounds"])) -> None:
            prog.round_done()
            acc = "-" if row.get("test-acc") is None else f"{100 * row['test-acc']:.2f}%"
            print(f"{head} round {row['round']}/{n} acc {acc} | cell "
                  f"{hms(time.monotonic() - t)}, sweep {prog.elapsed()}, ETA {prog.eta()}",
                  flush=True)

        run_ = CellRun()
        rounds = RoundsTail(cell_dir, since=time.time())
        try:
            with (cell_dir / "sweep.log").open("a") as log, \
                    (staged_app(REPO) if connection else nullcontext(REPO)) as app:
                cmd = command_for(cell, cell_dir, connection, plan.resources, in_process, app)
                log.write("$ " + " ".join(cmd) + "\n")
                run_cell(cmd, env, log, rounds, on_round, run_, connection or "local")
        except KeyboardInterrupt:
            print(f"{head} interrupted; stopped Flower run {run_.run_id}; rerun to resume",
                  flush=True)
            write_report(plan, collect(plan, cells_dir), out, command)
            return 130
        prog.end_cell()
        status = "completed" if run_.code == 0 else f"exit {run_.code}"
        if connection is not None:
            status = (run_status(env, run_.run_id, connection) if run_.run_id
                      else "did not start")
        run = finished_run(cell_dir, cell)
        if run is None:
            failed.append(cell.id)
            print(f"{head} FAILED ({status}); log: {cell_dir / 'sweep.log'}", flush=True)
            if status == "finished:completed":
                print(f"{head} the run completed but wrote no summary.json under {cell_dir}: "
                      "the ServerApp writes output-dir on its own machine; make that path "
                      "shared (or copy the run back) and rerun with --report", flush=True)
        else:
            summary = collect_one(plan, cells_dir, cell)
            print(f"{head} done in {hms(time.monotonic() - t_cell)}: {summary}", flush=True)
        write_report(plan, collect(plan, cells_dir), out, command)
    write_report(plan, collect(plan, cells_dir), out, command)
    print(f"sweep {plan.name}: {len(todo) - len(failed)}/{len(todo)} ran, "
          f"{len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; "
          f"{out / 'results.md'}", flush=True)
    return 1 if failed else 0


def collect_one(plan: SweepPlan, cells_dir: Path, cell: Cell) -> str:
    """'smoothed peak 71.20%, final 70.93%' for a finished cell."""
    (res,) = [r for r in collect(plan, cells_dir) if r.cell.id == cell.id]
    final = res.summary.get("final-test-acc")
    metric = f"{100 * res.metric:.2f}%" if res.metric is not None else "n/a"
    return f"metric {metric}, final {100 * final:.2f}%" if final is not None else metric


def dry_run(cells: Sequence[Cell], cells_dir: Path) -> None:
    """List the cells, marking those already finished."""
    for i, c in enumerate(cells, 1):
        mark = "done" if finished_run(cells_dir / c.id, c) else "todo"
        print(f"{i:4d} {mark} {c.id}  " + " ".join(f"{k}={v}" for k, v in c.coords.items()))
    rounds = sum(int(c.config["num-server-rounds"]) for c in cells)
    print(f"{len(cells)} cells, {rounds} rounds in all")


@refuses("sweep")
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("grid", type=Path, help="an experiments/*.yaml file")
    ap.add_argument("--out", type=Path, help="sweep directory (default outputs/sweeps/NAME)")
    ap.add_argument("--cells", type=Path,
                    help="cell directory (default OUT/cells); grids that share it share runs")
    ap.add_argument("--connection", help="run on this deployment connection instead of "
                    "simulating (the yaml's connection: is the default)")
    ap.add_argument("--dry-run", action="store_true", help="validate and list cells; run none")
    ap.add_argument("--only", metavar="PATTERN", help="only cells whose id matches (glob)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a base run-config key for every cell (repeatable)")
    ap.add_argument("--report", action="store_true", help="rewrite the report; run nothing")
    ap.add_argument("--in-process", action="store_true",
                    help="run each cell with fedinit/cli/inprocess_run.py (no Flower engine)")
    ap.add_argument("--num-cpus-per-client", type=float,
                    help="Ray CPUs per simulated client (default: the yaml's resources, or 1)")
    ap.add_argument("--num-gpus-per-client", type=float,
                    help="Ray GPUs per simulated client (default: the yaml's resources, or 0)")
    args = ap.parse_args(argv)

    with refusing(ValueError, prefix="--set "):
        extra = parse_overrides(args.set)
    with refusing(PlanError):
        plan = load_plan(args.grid, extra)
    out = (args.out or REPO / "outputs" / "sweeps" / plan.name).resolve()
    cells_dir = (args.cells or out / "cells").resolve()
    cells = select(plan.cells, args.only)
    if not cells:
        raise Refused(f"no cell id matches {args.only!r}")
    command = " ".join(["fedinit-sweep", str(args.grid),
                        *(f"--{k} {v}" for k, v in (("out", args.out), ("cells", args.cells))
                          if v is not None),
                        *(f"--set {s}" for s in args.set)])
    if args.dry_run:
        dry_run(cells, cells_dir)
        return 0
    if args.report:
        write_report(plan, collect(plan, cells_dir), out, command)
        print(f"sweep: report written to {out / 'results.md'}")
        return 0
    connection = args.connection or plan.connection
    for key in ("num-cpus-per-client", "num-gpus-per-client"):
        value = getattr(args, key.replace("-", "_"))
        if value is not None:
            plan.resources[key] = value
    env = flower_env()
    if connection is not None and not os.environ.get("FLWR_HOME"):
        print("sweep: note: FLWR_HOME is not set; the connection must be in "
              f"{env['FLWR_HOME']}/config.toml", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill PID` stops the cell's run too
    if args.in_process and connection is not None:
        raise Refused("--in-process runs locally; it cannot take a connection")
    return run_sweep(plan, cells, out, cells_dir, connection, command, env, args.in_process)


if __name__ == "__main__":
    sys.exit(main())
