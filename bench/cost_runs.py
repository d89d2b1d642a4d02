"""What the in-process cost benches share (``dp_cost``, ``tracking_cost``,
``personal_eval_cost``): their command line, one run with some functions timed, and the
patch that times one function.

Each runs the real round loop and ClientApp handlers in this process
(``fedinit/cli/inprocess_grid.py``) on one torch thread, so its seconds compare across runs.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.cli.simulate import parse_overrides
from fedinit.config import RunConfig
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment


def cost_args(doc: str, rounds: int,
              argv: Sequence[str] | None = None) -> tuple[int, dict[str, Any]]:
    """(--rounds, the ``key=value`` run-config overrides) of a cost bench's command line,
    ``rounds`` by default; torch is then set to one thread, as every one of them measures."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", metavar="key=value")
    ap.add_argument("--rounds", type=int, default=rounds)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    return args.rounds, parse_overrides(args.overrides)


class Timed:
    """Adds up the wall time of one function while the run uses it (patched in place)."""

    def __init__(self, owner: Any, name: str) -> None:
        self.owner, self.name, self.seconds = owner, name, 0.0
        self.inner = getattr(owner, name)

    def __enter__(self) -> Timed:
        inner = self.inner

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0

        setattr(self.owner, self.name, timed)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self.owner, self.name, self.inner)


@dataclass(frozen=True)
class CostRun:
    """One finished in-process run: its config, grid (the messages sent and replied),
    summary, rows, and the seconds spent in each timed function."""

    cfg: RunConfig
    grid: InProcessGrid
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    seconds: dict[str, float]


def cost_run(raw: dict[str, Any], timed: Mapping[str, tuple[Any, str]] | None = None) -> CostRun:
    """Run ``raw`` in-process in a temporary output directory, each ``timed`` function
    (label -> (owner, attribute name)) patched by ``Timed`` for the run."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = {**raw, "output-dir": tmp}
        cfg = RunConfig.parse(raw)
        grid = InProcessGrid(cfg.num_clients, raw)
        with contextlib.ExitStack() as patches:
            clocks = {label: patches.enter_context(Timed(owner, name))
                      for label, (owner, name) in (timed or {}).items()}
            summary = run_experiment(grid, cfg, Path(tmp) / "run")
        # the operator's rows: under DP the public files withhold the timings a cost is made of
        rows = load_checkpoint(Path(tmp) / "run").rows
    return CostRun(cfg, grid, summary, rows, {k: c.seconds for k, c in clocks.items()})
