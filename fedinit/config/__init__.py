"""The run config: ``RunConfig`` (``run_config.py``) and its typed groups, one module each
(``train``, ``data``, ``evaluation``, ``privacy``, ``robust``, ``fleet``, ``schedule``), the
checks between groups (``cross.py``) and the order all checks run in (``checks.py``); the
allowed values (``choices.py``), the one error type (``errors.py``), which keys define an
experiment (``keys.py``).

A layer of its own: over the pure rules (``fedinit.methods``) and the data-set registry
(``fedinit.data_sets``), under the task, the strategies and the apps. The names below load
on first use, so a module that needs only ``choices`` or ``errors`` (the model builder on a
device) does not load every group's checks."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedinit.lazy import names_on_first_use

if TYPE_CHECKING:
    from fedinit.config.checks import check_examples, check_writable
    from fedinit.config.defaults import load_defaults
    from fedinit.config.errors import ConfigError
    from fedinit.config.run_config import RunConfig

HOME = {"ConfigError": "errors", "RunConfig": "run_config", "check_examples": "checks",
        "check_writable": "checks", "load_defaults": "defaults"}
"""Name -> the module of this package that holds it."""


__getattr__ = names_on_first_use(__name__, HOME)

__all__ = ["ConfigError", "RunConfig", "check_examples", "check_writable", "load_defaults"]
