"""Experiment tracking in TensorBoard's format: every number of every round's row, the run
config as hyperparameters, and the clients' personalized accuracies as distributions.

Written by TensorBoard's own writer (``torch.utils.tensorboard``), under ``<run>/tensorboard``,
so that ``tensorboard --logdir <output-dir>`` lays every run of a sweep side by side. A row is
flushed as it is written (the same moment rounds.jsonl is). A resumed run writes with
``purge_step`` = its first round: TensorBoard's reader then drops what the first run wrote from
that round on, so the step axis holds each round once whatever was written past the checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedinit.config.errors import ConfigError
from fedinit.methods import wire as rk
from server_app.client_divergence import FIELDS as DIVERGENCE_FIELDS
from server_app.federated_eval import FIELDS as FEDERATED_FIELDS
from server_app.public_rows import TIMING_FIELDS
from strategies.personal_summary import FIELDS as PERSONAL_FIELDS

EVENTS_DIR = "tensorboard"
"""The run directory's sub-directory that holds the event files."""
_GROUPS: tuple[tuple[str, frozenset[str]], ...] = (
    ("eval", frozenset({"test-acc", "test-loss"})),
    ("personal", frozenset(PERSONAL_FIELDS) - TIMING_FIELDS),
    ("federated", frozenset(FEDERATED_FIELDS) - TIMING_FIELDS),
    ("divergence", frozenset({rk.DIVERGENCE, *DIVERGENCE_FIELDS}) - TIMING_FIELDS),
    ("time", TIMING_FIELDS),
)
HPARAM_METRICS = ("eval/test-acc", "eval/test-loss")
"""The scalars TensorBoard's HParams view lists beside each run's config."""


class TrackingUnavailable(ConfigError):
    """``tracking=tensorboard`` without the ``tensorboard`` package installed: a setting this
    install cannot run, reported (and the run failed) as any bad setting is."""


def tag_of(column: str) -> str:
    """The TensorBoard tag of a row's column: '<group>/<column>' (groups are the panels
    TensorBoard draws: eval, train, personal, federated, divergence, privacy, time)."""
    if column.startswith("dp-"):
        return f"privacy/{column}"
    for group, columns in _GROUPS:
        if column in columns:
            return f"{group}/{column}"
    return f"train/{column}"


def numeric_columns(row: Mapping[str, Any]) -> dict[str, float]:
    """The row's columns that hold one number (bools, lists and missing values are not
    scalars), by column name; ``round`` is the step, not a value."""
    return {k: float(v) for k, v in row.items()
            if k != "round" and isinstance(v, int | float) and not isinstance(v, bool)}


def check_available(tracking: str) -> None:
    """Fail before any work when the tracking asked for cannot be written."""
    if tracking != "tensorboard":
        return
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise TrackingUnavailable(
            "run config: tracking='tensorboard' needs the tensorboard package (pip install "
            "tensorboard==2.21.0, as pyproject pins it), or set tracking=off") from None


def _hparam_value(value: Any) -> int | float | str | bool:
    return value if isinstance(value, int | float | str | bool) else str(value)


class TensorBoardTracker:
    """One run's event files; ``first_round`` > 1 when the run resumes. ``hide_times``: every
    event carries the tracker's start as its wall time, so the files do not time the rounds
    (the rows withhold their timings: ``server_app.public_rows``)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any], first_round: int = 1,
                 hide_times: bool = False) -> None:
        check_available("tensorboard")
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        self.dir = run_dir / EVENTS_DIR
        self._walltime = time.time() if hide_times else None
        self._writer = SummaryWriter(log_dir=str(self.dir), purge_step=first_round,
                                     flush_secs=3600)
        if first_round == 1:  # a resumed run's hyperparameters are already there
            config_values = {k: _hparam_value(v) for k, v in sorted(config.items())}
            for summary in hparams(config_values, dict.fromkeys(HPARAM_METRICS, 0.0)):
                self._writer.file_writer.add_summary(summary)
        self._writer.flush()

    def add_round(self, row: Mapping[str, Any]) -> None:
        """Every number of the row at step ``row['round']``, on disk when this returns."""
        step = int(row["round"])
        for column, value in numeric_columns(row).items():
            self._writer.add_scalar(tag_of(column), value, global_step=step,
                                    walltime=self._walltime)
        self._writer.flush()

    def add_clients(self, server_round: int, by_kind: Mapping[str, Sequence[float]]) -> None:
        """Per-client distributions of one round (e.g. each kind of personalized accuracy)."""
        for name, values in by_kind.items():
            finite = [v for v in values if v is not None and math.isfinite(v)]
            if finite:
                self._writer.add_histogram(f"clients/{name}", np.asarray(finite),
                                           global_step=server_round, walltime=self._walltime)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def client_columns(rows: Iterable[Mapping[str, Any]], columns: Sequence[str],
                   ) -> dict[str, list[float]]:
    """{column: its values over the rows} for the numeric per-client columns."""
    out: dict[str, list[float]] = {c: [] for c in columns}
    for row in rows:
        for c in columns:
            v = row.get(c)
            if isinstance(v, int | float) and not isinstance(v, bool):
                out[c].append(float(v))
    return {c: v for c, v in out.items() if v}
