"""The ServerApp entry point: validate the run config once, then run the experiment."""

from __future__ import annotations

from logging import ERROR

from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from server_app.clients import FederationError
from server_app.experiment import run_experiment
from task.config import ConfigError, RunConfig
from task.datasets import DataFormatError, DataNotFoundError

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Fail fast with one line on a bad config, missing data or a wrong-sized federation."""
    try:
        cfg = RunConfig.parse(context.run_config)
        run_experiment(grid, cfg)
    except (ConfigError, DataNotFoundError, DataFormatError, FederationError) as err:
        log(ERROR, "%s", err)
        raise SystemExit(f"fedinit: {err}") from None
