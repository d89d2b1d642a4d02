"""Robust rules over FedBuff's buffer (``aggregation`` under ``rounds=async``): the real loop,
strategy and client path on the least-squares problem with a hand-written completion order
and one hostile client (its upload x -10, ``testbeds/lsq_async.py``). Each flush equals an
oracle written here: the rule over the K raw deltas (median; Krum's pick by its own scores),
scaled by the mean s(tau) of the replies it kept; the hostile reply is left out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedinit.config import ConfigError, RunConfig
from testbeds.lsq_async import Script, run_lsq_async
from testbeds.lsq_problem import Problem, lsq_problem

N, DIM, K_STEPS, LR, K, F = 6, 5, 5, 0.05, 5, 1
BASE = {"num-clients": N, "lr": LR, "local-epochs": K_STEPS, "batch-size": 1000,
        "weight-decay": 0.0, "clip-norm": 0.0, "lr-decay": 1.0, "beta": 0.0,
        "max-update-norm-ratio": 0.0, "personal-eval-every": 0, "output-dir": "/tmp/unused",
        "rounds": "async", "concurrency": N, "buffer-size": K, "staleness": "poly",
        "staleness-a": 0.5, "weighting": "uniform", "ri-aggregation": "update",
        "byzantine-f": F, "num-server-rounds": 2}
HOSTILE = 2
SCRIPT: Script = [(0, "ok"), (1, "ok"), (HOSTILE, "flip"), (3, "ok"), (4, "ok"),
                  (5, "ok"), (HOSTILE, "flip"), (0, "ok"), (4, "ok"), (1, "ok")]
"""Flush 1 all at tau 0; flush 2: clients 5, 2, 0 and 1 at tau 1, client 4 at tau 0."""


def problem() -> Problem:
    return lsq_problem(num_clients=N, dim=DIM, n=20, seed=5)


def median_rule(deltas: list[np.ndarray], s: list[float]) -> tuple[np.ndarray, list[int]]:
    return float(np.mean(s)) * np.median(np.stack(deltas), axis=0), list(range(len(deltas)))


def krum_rule(deltas: list[np.ndarray], s: list[float]) -> tuple[np.ndarray, list[int]]:
    """Krum (Blanchard et al. 2017): the reply whose n - f - 2 nearest others are closest."""
    n = len(deltas)
    scores = []
    for i in range(n):
        d = sorted(float(np.sum((deltas[i] - deltas[j]) ** 2)) for j in range(n) if j != i)
        scores.append(sum(d[:n - F - 2]))
    pick = int(np.argmin(scores))
    return s[pick] * deltas[pick], [pick]


def mean_rule(deltas: list[np.ndarray], s: list[float]) -> tuple[np.ndarray, list[int]]:
    return sum(si * d for si, d in zip(s, deltas, strict=True)) / len(deltas), []


def oracle(rule: Any) -> tuple[np.ndarray, list[list[int]]]:
    """FedBuff over SCRIPT in float64 with ``rule`` at each flush; the clients it kept."""
    p = problem()
    w = p.w0.astype(np.float64)
    version, buffer, kept = 0, [], []
    task = {cid: (0, w.copy()) for cid in range(N)}
    for cid, fate in SCRIPT:
        v_sent, w_sent = task[cid]
        y = w_sent.copy()
        for _ in range(K_STEPS):
            y -= LR * p.gradient(cid, y)
        delta = (y - w_sent) * (-10.0 if fate == "flip" else 1.0)
        buffer.append((cid, delta, (1.0 + version - v_sent) ** -0.5))
        if len(buffer) == K:
            d, chosen = rule([b[1] for b in buffer], [b[2] for b in buffer])
            kept.append([buffer[i][0] for i in chosen])
            w = (w + d.astype(np.float32)).astype(np.float32).astype(np.float64)
            version, buffer = version + 1, []
        task[cid] = (version, w.copy())
    return w, kept


@pytest.mark.parametrize(("kind", "rule"), [("median", median_rule), ("krum", krum_rule)])
def test_the_rule_over_the_buffer_equals_the_oracle_and_leaves_out_the_attacker(
        tmp_path: Path, kind: str, rule: Any) -> None:
    cfg = RunConfig.parse({**BASE, "aggregation": kind})
    got, _, _, _ = run_lsq_async(problem(), cfg, SCRIPT, tmp_path)
    want, kept = oracle(rule)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    if kind == "krum":
        assert all(HOSTILE not in k for k in kept)
    plain, _ = oracle(mean_rule)  # the mean takes the attacker in: far off
    assert np.abs(plain - want).max() > 0.1


def test_a_buffer_too_small_for_the_rule_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**BASE, "aggregation": "krum", "buffer-size": 4})
    text = str(err.value)
    assert "buffer-size=4 is not allowed; allowed: at least 5" in text
    assert "n > 2f + 2" in text and "\n" not in text
    RunConfig.parse({**BASE, "aggregation": "median", "buffer-size": 1})


def test_scaffold_with_a_robust_rule_is_refused_under_async() -> None:
    with pytest.raises(ConfigError, match="aggregation='median' is not allowed; allowed: mean "
                                          "with method='scaffold' with rounds='async' "):
        RunConfig.parse({**BASE, "aggregation": "median", "method": "scaffold"})
    RunConfig.parse({**BASE, "aggregation": "median", "method": "scaffold", "rounds": "sync",
                     "fraction-train": 1.0})
