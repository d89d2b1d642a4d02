"""The regimes of a run in its results: which client is in which regime, and how it looks.

With ``num-regimes`` > 0 a run writes ``regimes.csv`` (partition-id, regime, transform) next
to ``config.json``, so a table can report accuracy per regime and a given graph for FedRelax
can be drawn from it (``fedinit/scripts/regime_graph.py``). The central test set is the data set's
untransformed test split, i.e. regime 0's task; ``CENTRAL_TEST`` says so in summary.json.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from fedinit.config import RunConfig
from fedinit.config.data import schema_of
from fedinit.store.files import atomic_write_text
from fedinit.task.federated_data import regimes_of
from fedinit.task.regimes import describe

REGIMES_FILE = "regimes.csv"
FIELDS: tuple[str, ...] = ("partition-id", "regime", "transform")
CENTRAL_TEST = "regime 0 (the untransformed test split: rotation 0, labels unpermuted)"
"""What the central test accuracy measures in a regimes run (summary.json ``central-test``)."""


def write_regimes(run_dir: Path, cfg: RunConfig) -> None:
    """Write regimes.csv for a run with regimes (nothing with ``num-regimes`` 0)."""
    if cfg.data.num_regimes == 0:
        return
    classes = schema_of(cfg).num_classes
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(FIELDS)
    for cid, regime in enumerate(regimes_of(cfg)):
        writer.writerow((cid, regime, describe(cfg.data.regime_kind, regime, classes, cfg.seed)))
    atomic_write_text(run_dir / REGIMES_FILE, text.getvalue())


def read_regimes(run_dir: Path) -> dict[int, int]:
    """partition id -> regime from a run's regimes.csv ({} for a run without regimes)."""
    path = run_dir / REGIMES_FILE
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        return {int(r["partition-id"]): int(r["regime"]) for r in csv.DictReader(f)}
