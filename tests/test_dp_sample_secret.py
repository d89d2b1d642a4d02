"""The secret sample stays secret in the public files (issue 42, item 2), in process.

An attacker's test: 4 registered clients, 2 of them never connect, m = 2 under
``dp=central``; two runs equal in everything but the secret sampling seed (fixed here by
``FEDINIT_DP_SAMPLING_SEED``), chosen so that round 1 samples both online clients in one run
and neither in the other. The operator-secret checkpoint shows the difference (the oracle);
the public files (tests/public_files.py: rows, summary, status.json, config, ledger,
TensorBoard, the log's round lines) must not, once the released model's figures and the
clock are taken out; the counts the rows carried before issue 42 would differ (the oracle
for the comparison itself). The process deployment's version: tests/test_deploy_dp.py.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import RunConfig
from server_app.checkpoint import load_checkpoint
from server_app.experiment import run_experiment
from server_app.public_rows import SAMPLE_FIGURES, TIMING_FIELDS
from server_app.status import STATUS_FILE
from strategies.operator_log import OPERATOR_LOG
from strategies.round_stages.sampling import SEED_ENV
from tests.flower_log import flower_lines
from tests.public_files import (
    differences,
    online_counts,
    public_view,
    seeds_with_different_samples,
)

pytestmark = pytest.mark.usefixtures("quick_runs")

N, M, ROUNDS, ONLINE = 4, 2, 3, (0, 1)
RUN = {"num-clients": N, "fraction-train": M / N, "num-server-rounds": ROUNDS,
       "train-limit": 200, "local-epochs": 1, "batch-size": 50, "node-wait-timeout": 3.0,
       "min-clients": len(ONLINE), "dp": "central", "weighting": "uniform",
       "dp-noise-multiplier": 1.0, "dp-clip": 0.05, "personal-eval-every": 0,
       "tracking": "tensorboard", "seed": 0}


class HalfOnline(InProcessGrid):
    """N registered clients, only ``ONLINE`` connected (the SuperLink lists only those)."""

    def __init__(self, run_config: dict[str, Any]) -> None:
        super().__init__(N, run_config)
        for cid in range(N):
            if cid not in ONLINE:
                self.contexts.pop(1000 + cid)


def run(tmp: Path, name: str, seed: int, monkeypatch: pytest.MonkeyPatch,
        **over: Any) -> tuple[Path, list[str]]:
    """One run with the secret sampling seed ``seed``; every line of its log, DEBUG too
    (a deployment streams what a library's root handler prints)."""
    registry = tmp / "registry.json"
    registry.write_text(json.dumps({str(1000 + p): p for p in range(N)}))
    cfg = RunConfig.parse({**RUN, **over, "node-registry": str(registry),
                           "output-dir": str(tmp)})
    monkeypatch.setenv(SEED_ENV, str(seed))
    with flower_lines(logging.DEBUG) as lines:
        run_experiment(HalfOnline(cfg.to_dict()), cfg, out_dir=tmp / name)
    return tmp / name, lines


def round_lines(lines: list[str]) -> list[str]:
    """The log's lines about a round, the released model's accuracy and loss taken out."""
    out = [x for x in lines if re.match(r"\[?round \d", x)]
    return [re.sub(r"acc +(-|\S+%) +loss +\S+", "acc _ loss _", x) for x in out]


@pytest.fixture(scope="module")
def seeds() -> tuple[int, int]:
    return seeds_with_different_samples(N, M, ONLINE, ROUNDS,
                                        lambda a, b: a[0] == 2 and b[0] == 0)


def test_two_samples_one_public_view(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     seeds: tuple[int, int]) -> None:
    (a, log_a), (b, log_b) = (run(tmp_path, name, seed, monkeypatch)
                              for name, seed in zip("ab", seeds, strict=True))
    # the oracle: the samples differ, as the operator's checkpoint shows, and the rows as
    # they were before issue 42 (the counts written) would have shown it too
    private = [load_checkpoint(d).rows for d in (a, b)]
    replies_a, replies_b = (online_counts(rows) for rows in private)
    assert replies_a[0] == 2 and replies_b[0] == 0, (replies_a, replies_b)
    counts = [[{k: r.get(k) for k in sorted(SAMPLE_FIGURES - TIMING_FIELDS)} for r in rows]
              for rows in private]
    assert counts[0] != counts[1]
    view_a, view_b = public_view(a), public_view(b)
    assert differences(view_a, view_b) == []
    assert view_a["tensorboard wall times"] == 1  # the events do not time the rounds
    nodes = json.loads((a / STATUS_FILE).read_text())["fleet"]["nodes"]
    assert len(nodes) == N and not any("connected" in n for n in nodes)
    assert round_lines(log_a) == round_lines(log_b) and len(round_lines(log_a)) >= ROUNDS
    # the operator keeps the full lines, in the run's operator-secret file
    assert "replies 2/2" in (a / OPERATOR_LOG).read_text()
    assert "replies 0/0" in (b / OPERATOR_LOG).read_text()
