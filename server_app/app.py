"""The ServerApp entry point: validate the run config once, then run the experiment."""

from __future__ import annotations

from logging import ERROR
from typing import cast

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid import InMemoryGrid

from node import object_pulls
from server_app import fast_dispatch
from server_app.checkpoint import CheckpointError
from server_app.clients import FederationError
from server_app.engine_facts import in_simulation
from server_app.experiment import ModelDiverged, NothingTrained, TooFewReplies, run_experiment
from server_app.fast_grid import FastPollGrid, WindowedSimGrid
from task.config import ConfigError, RunConfig
from task.datasets import DataFormatError, DataNotFoundError

app = ServerApp()


class RunAborted(RuntimeError):
    """The run cannot start or go on; the message says why in one line."""


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Fail with one line (run status finished:failed) on a bad config, missing data, a
    wrong-sized federation, a diverged model or a run that aggregated nothing."""
    try:
        cfg = RunConfig.parse(context.run_config)
        # the simulation's own grid already pulls every 0.1 s; it only gets a window of
        # messages in flight (fast_grid.send_windowed), and stays an InMemoryGrid, whose node
        # list the server reads (server_app/engine_facts.py)
        if in_simulation(grid):
            fast_dispatch.install(cast(InMemoryGrid, grid).state)  # no scan for idle nodes
            run_experiment(WindowedSimGrid(cast(InMemoryGrid, grid)), cfg)
        else:
            object_pulls.install(object_pulls.SERVERAPP)  # replies' arrays: no 1 s retries
            run_experiment(FastPollGrid(grid), cfg)
    except (ConfigError, DataNotFoundError, DataFormatError, FederationError,
            CheckpointError, TooFewReplies, ModelDiverged, NothingTrained) as err:
        # One readable line first; then fail the run (Flower marks it finished:failed; a
        # SystemExit would be reported as completed).
        log(ERROR, "%s", err)
        raise RunAborted(str(err)) from None
