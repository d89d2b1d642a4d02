"""Run one experiment in this process: the real ServerApp round loop and ClientApp handlers,
without Flower's simulation engine (``fedinit/cli/inprocess_grid.py`` plays the SuperLink).

    .venv/bin/python -m fedinit.cli.inprocess_run method=ditto num-server-rounds=10

Same arguments, results directory and results files as ``fedinit/cli/simulate.py``; it skips the
30-60 s of SuperLink and Ray start-up per run, which is most of a short cell on a small
machine (``fedinit/cli/sweep.py --in-process``). Client state lives in each node's in-memory
context, as in the simulation. torch uses one thread (the measured fastest on 2 busy cores).
"""

from __future__ import annotations

import sys

import torch

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.cli.simulate import parse_overrides
from fedinit.config import ConfigError, RunConfig
from fedinit.node.launch import plain_logs_off_terminal
from server_app.experiment import run_experiment


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        raw = parse_overrides(args)
        cfg = RunConfig.parse(raw)
    except (ValueError, ConfigError) as err:
        print(f"inprocess_run: {err}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    plain_logs_off_terminal()  # a sweep's sweep.log is a file: no colour codes in it
    run_experiment(InProcessGrid(cfg.num_clients, raw), cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
