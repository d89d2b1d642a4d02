"""Under DP the public files carry only what epsilon covers (issue 42, item 3).

A DP run with every per-client figure on (federated evaluation, the divergence query each
round, personalized evaluation) computes them all: the operator-secret checkpoint's rows hold
them (the oracle: the fields exist and have values). The public files (rounds.jsonl,
rounds.csv, summary.json, TensorBoard) and the INFO progress line carry none of them, unless
the run says ``dp-release-client-metrics=true``.
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from server_app.public_rows import (
    CLIENT_FIGURES,
    FEDERATED_EVAL,
    RELEASE_KEY,
    SAMPLE_FIGURES,
    withheld,
)
from server_app.results import DP_FIELDS, DP_LEFT_OUT, ROUND_FIELDS
from server_app.tracking import EVENTS_DIR, tag_of
from strategies.virtual_clock import CLOCK_FIELDS
from tests.flower_log import flower_lines

pytestmark = pytest.mark.usefixtures("quick_runs")

DP_RUN = {"num-clients": 3, "fraction-train": 0.67, "num-server-rounds": 2, "train-limit": 300,
          "local-epochs": 1, "batch-size": 50, "node-wait-timeout": 3.0, "dp": "central",
          "weighting": "uniform", "dp-noise-multiplier": 1.0, "dp-clip": 0.05,
          "evaluation": "federated", "divergence-every": 1, "personal-eval-every": 2,
          "personal-eval-clients": 0, "local-test-fraction": 0.2, "tracking": "tensorboard"}
"""Every per-client figure a DP run may compute, each round."""
SHOWN = ("train-loss", "test-acc", "divergence-all", "local-global-mean")
"""Client figures the run computes with a value (the oracle reads them in the checkpoint)."""


def run(tmp: Path, **over: Any) -> Path:
    cfg = RunConfig.parse({**DP_RUN, **over, "output-dir": str(tmp)})
    run_experiment(InProcessGrid(cfg.num_clients, cfg.to_dict()), cfg, out_dir=tmp / "run")
    return tmp / "run"


def public_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


def event_tags(run_dir: Path) -> set[str]:
    events = EventAccumulator(str(run_dir / EVENTS_DIR), size_guidance={"scalars": 0})
    events.Reload()
    return set(events.Tags()["scalars"])


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory: pytest.TempPathFactory, quick_runs: None) -> tuple[Path, str]:
    """A default DP run (nothing released) and its log at INFO."""
    tmp = tmp_path_factory.mktemp("dp-withheld")
    with flower_lines(logging.INFO) as lines:
        run_dir = run(tmp)
    return run_dir, "\n".join(lines)


def test_the_checkpoint_holds_the_client_figures_the_public_files_withhold(
        dp_run: tuple[Path, str]) -> None:
    run_dir, _ = dp_run
    private = load_checkpoint(run_dir).rows
    for field in SHOWN:  # computed: the test below has something to miss
        assert any(r.get(field) is not None for r in private), field
    hidden = CLIENT_FIGURES | FEDERATED_EVAL
    rows = public_rows(run_dir)
    assert [r["round"] for r in rows] == [1, 2]
    assert all(not hidden & set(r) for r in rows), rows[0].keys()
    assert all("dp-epsilon" in r for r in rows)
    with (run_dir / "rounds.csv").open(newline="") as f:
        header = next(csv.reader(f))
    assert not hidden & set(header) and "dp-epsilon" in header
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final-test-acc"] is None and summary["best-test-acc"] is None
    tags = event_tags(run_dir)
    assert "privacy/dp-epsilon" in tags
    assert not {tag_of(f) for f in hidden} & tags, sorted(tags)


def test_the_info_log_says_no_client_figure(dp_run: tuple[Path, str]) -> None:
    _, text = dp_run
    progress = [x for x in text.splitlines() if x.startswith("[round ")]
    assert len(progress) == 2, text[-2000:]
    for word in ("train-loss", " div ", " acc ", "local g/ft/own"):
        assert not any(word in x for x in progress), (word, progress)
    assert all("epsilon" in x for x in progress)


def test_the_release_key_writes_them_as_the_checkpoint_holds_them(tmp_path: Path) -> None:
    run_dir = run(tmp_path, **{RELEASE_KEY: True})
    rows, private = public_rows(run_dir), load_checkpoint(run_dir).rows
    for field in SHOWN:
        assert [r.get(field) for r in rows] == [r.get(field) for r in private], field
    assert any(r["train-loss"] is not None for r in rows)
    assert f"{tag_of('train-loss')}" in event_tags(run_dir)


def table(dp: str, *, secret: bool = True, release: bool = False,
          source: str = "central") -> frozenset[str]:
    return withheld(dp, secret_sample=secret, release_client_metrics=release,
                    eval_source=source)


def test_the_table() -> None:
    assert table("off", source="federated") == set()
    central = table("central")
    assert {"train-loss", "divergence", "divergence-all", "local-global-mean",
            "fed-eval-clients", "norm-limit-used"} <= central
    assert central >= SAMPLE_FIGURES  # the sync sample is secret
    assert not FEDERATED_EVAL & central  # the server's own test set: covered
    assert table("local", source="federated") >= FEDERATED_EVAL
    released = table("central", release=True, source="federated")
    assert not CLIENT_FIGURES & released and released >= SAMPLE_FIGURES
    assert not SAMPLE_FIGURES & table("central", secret=False)  # async: q = 1
    assert not CLIENT_FIGURES & SAMPLE_FIGURES


def test_every_row_field_is_classified() -> None:
    """A new row field fails here until it is put in a class: covered by epsilon (the
    released model, the public schedule, the accounting), left out under DP, withheld, or
    one of async's own columns (no secret sample is claimed there)."""
    covered = {"round", "test-acc", "test-loss", "lr", *DP_FIELDS}
    classes = covered | set(DP_LEFT_OUT) | SAMPLE_FIGURES | CLIENT_FIGURES
    assert set(ROUND_FIELDS) | set(CLOCK_FIELDS) <= classes, set(ROUND_FIELDS) - classes
    assert not covered & (SAMPLE_FIGURES | CLIENT_FIGURES) - FEDERATED_EVAL
