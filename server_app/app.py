"""The ServerApp entry point: validate the run config once, then run the experiment."""

from __future__ import annotations

from logging import ERROR

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedinit.config import ConfigError, RunConfig
from fedinit.flower_compat import install
from fedinit.task.datasets import DataFormatError, DataNotFoundError
from server_app.checkpoint import CheckpointError
from server_app.clients import FederationError
from server_app.engine_facts import in_simulation
from server_app.experiment import run_experiment
from server_app.run_basics import ModelDiverged, NothingTrained
from strategies.round_stages.quorum import TooFewReplies

app = ServerApp()


class RunAborted(RuntimeError):
    """The run cannot start or go on; the message says why in one line."""


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Fail with one line (run status finished:failed) on a bad config, missing data, a
    wrong-sized federation, a diverged model or a run that aggregated nothing."""
    try:
        cfg = RunConfig.parse(context.run_config)
        # the simulation's grid gets a window of messages in flight and stays an
        # InMemoryGrid, whose node list the server reads (server_app/engine_facts.py); a
        # deployment's grid pulls replies every 0.1 s (docs/flower_compat.md)
        run_experiment(install("serverapp", grid=grid, simulation=in_simulation(grid)).grid,
                       cfg)
    except (ConfigError, DataNotFoundError, DataFormatError, FederationError,
            CheckpointError, TooFewReplies, ModelDiverged, NothingTrained) as err:
        # One readable line first; then fail the run (Flower marks it finished:failed; a
        # SystemExit would be reported as completed).
        log(ERROR, "%s", err)
        raise RunAborted(str(err)) from None
