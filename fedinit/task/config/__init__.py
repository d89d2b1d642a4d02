"""The run config: ``RunConfig`` (``run_config.py``) and its typed groups, one module each
(``train``, ``data``, ``evaluation``, ``privacy``, ``robust``, ``fleet``, ``schedule``), the
checks between groups (``cross.py``) and the order all checks run in (``checks.py``)."""

from __future__ import annotations

from fedinit.task.config.checks import check_examples, check_writable
from fedinit.task.config.defaults import load_defaults
from fedinit.task.config.run_config import RunConfig
from fedinit.task.config_checks import ConfigError

__all__ = ["ConfigError", "RunConfig", "check_examples", "check_writable",
           "load_defaults"]
