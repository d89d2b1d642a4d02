"""FedCM under ``rounds=async``: the real FedBuff loop, strategy and client code on the
least-squares problem with a hand-written completion order (``testbeds/lsq_async.py``), against
a numpy replay of the rule written here: each task carries the momentum d of the version it was
sent, a client steps along alpha g + (1 - alpha) d, and a flush makes w <- w + eta_g D and
d <- -D / (K eta) from the buffered, staleness-weighted D (docs/algorithms.md, FedBuff)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedinit.config import RunConfig
from testbeds.lsq_async import Script, run_lsq_async
from testbeds.lsq_problem import Problem, buffered_replay, lsq_problem

N, DIM, K_STEPS, LR, ALPHA = 4, 5, 5, 0.05, 0.3
LOCAL = {"num-clients": N, "lr": LR, "local-epochs": K_STEPS, "batch-size": 1000,
         "weighting": "uniform", "weight-decay": 0.0, "clip-norm": 0.0, "lr-decay": 1.0,
         "beta": 0.0, "max-update-norm-ratio": 0.0, "personal-eval-every": 0,
         "output-dir": "/tmp/unused", "rounds": "async", "concurrency": N,
         "method": "fedcm", "fedcm-alpha": ALPHA}
"""Full-batch steps (batch-size > n), no RI, decay, clipping or norm filter."""
SCRIPT: Script = [(0, "ok"), (1, "ok"), (0, "ok"), (2, "ok"), (0, "lost"), (1, "ok"),
                  (3, "ok"), (0, "ok"), (2, "nan"), (1, "ok"), (3, "ok"), (0, "ok"),
                  (2, "ok"), (1, "ok")]
"""Client 3 first answers after two flushes (tau 2); client 0 loses a reply and client 2's
second is rejected (NaN): replies of one flush started from up to three versions."""


def problem() -> Problem:
    return lsq_problem(num_clients=N, dim=DIM, n=20, seed=5)


def oracle(script: Script, buffer_size: int, flushes: int, a: float,
           server_lr: float) -> dict[str, Any]:
    """FedBuff with FedCM's momentum over ``script``, in float64 (the model and d are float32
    between flushes, as on the wire)."""
    p = problem()
    w, d = p.w0.astype(np.float64), np.zeros(DIM)

    def train(cid: int, sent: tuple[np.ndarray, np.ndarray], tau: int
              ) -> tuple[np.ndarray, int]:
        w_sent, d_sent = sent
        y = w_sent.copy()
        for _ in range(K_STEPS):
            y -= LR * (ALPHA * p.gradient(cid, y) + (1.0 - ALPHA) * d_sent)
        return y - w_sent, tau

    def flush(buffer: list[tuple[np.ndarray, int]]) -> None:
        nonlocal w, d
        big_d = sum((1.0 + tau) ** -a * move for move, tau in buffer) / buffer_size
        w = (w + server_lr * big_d).astype(np.float32).astype(np.float64)
        d = (-big_d / (K_STEPS * LR)).astype(np.float32).astype(np.float64)

    buffered_replay(script, N, buffer_size, flushes, lambda cid, busy: (w.copy(), d.copy()),
                    train, flush)
    return {"w": w, "d": d}


@pytest.mark.parametrize(("a", "server_lr"), [(0.5, 1.0), (0.0, 0.7)])
def test_stale_lost_and_rejected_replies_match_the_oracle(tmp_path: Path, a: float,
                                                          server_lr: float) -> None:
    cfg = RunConfig.parse({**LOCAL, "buffer-size": 2, "num-server-rounds": 5,
                           "staleness": "poly", "staleness-a": a, "server-lr": server_lr})
    w, strategy, _, _ = run_lsq_async(problem(), cfg, SCRIPT, tmp_path)
    want = oracle(SCRIPT, 2, 5, a, server_lr)
    np.testing.assert_allclose(w, want["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(strategy.state.d[0], want["d"], rtol=1e-5, atol=1e-6)
    assert np.linalg.norm(want["d"]) > 1e-2  # the momentum is not zero


def test_the_momentum_changes_the_run(tmp_path: Path) -> None:
    """The same script with fedcm-alpha = 1 (d ignored by the clients) gives another model:
    the d each task carries is used, so the oracle above tests something."""
    raw = {**LOCAL, "buffer-size": 2, "num-server-rounds": 5, "staleness": "constant"}
    with_d, _, _, _ = run_lsq_async(problem(), RunConfig.parse(raw), SCRIPT, tmp_path / "a")
    without, _, _, _ = run_lsq_async(problem(), RunConfig.parse({**raw, "fedcm-alpha": 1.0}),
                                     SCRIPT, tmp_path / "b")
    assert np.abs(with_d - without).max() > 1e-3
