"""The operator's own log under DP: the lines that name a sampled client or count a round's
replies go to ``<run dir>/operator.log`` (operator-secret, as the checkpoint is), never to the
ServerApp's log.

Why a file and not DEBUG: what the ServerApp's process prints is the run's log that
`flwr run --stream` and `flwr log` show, and Flower's logger hands DEBUG records on to the
root logger, where a library's handler prints them (TensorBoard's absl puts one there: a
deployment with ``tracking=tensorboard`` streamed the DEBUG lines). This logger does not
propagate, so a line sent here reaches only the file.
"""

from __future__ import annotations

import logging
from pathlib import Path

from flwr.common.logger import log

OPERATOR_LOG = "operator.log"
"""The run directory's operator-secret log (written only under DP)."""
_LOGGER = logging.getLogger("fedinit.operator")
_LOGGER.propagate = False
_LOGGER.setLevel(logging.DEBUG)
_LOGGER.addHandler(logging.NullHandler())  # no file attached: dropped, never on stderr


def log_line(private: bool, level: int, msg: str, *args: object) -> None:
    """``msg`` to the operator's file when ``private`` (DP: it says who was sampled), else
    to the ServerApp's log at ``level``."""
    if private:
        _LOGGER.log(level, msg, *args)
    else:
        log(level, msg, *args)


def attach(run_dir: Path) -> None:
    """From now on private lines are appended to ``run_dir/operator.log``; a file attached
    before (a run in this process that stopped without ``detach``) is closed first."""
    detach()
    handler = logging.FileHandler(run_dir / OPERATOR_LOG, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    _LOGGER.addHandler(handler)


def detach() -> None:
    """Close the operator's file: private lines are dropped until the next ``attach``."""
    for handler in [h for h in _LOGGER.handlers if isinstance(h, logging.FileHandler)]:
        _LOGGER.removeHandler(handler)
        handler.close()
