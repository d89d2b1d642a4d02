"""FedProx and FedDyn under RI (beta != 0): the proximal centre is the RI start point s_i.

s_i = w_t + beta (w_t - w_prev_i). The prox gradient mu (w - s_i) (FedProx) or alpha (w - s_i)
(FedDyn), and FedDyn's h_i <- h_i + (w_iK - s_i), must use s_i, not the global model w_t.
With beta = 0 the two coincide, so only tests at beta != 0 with w_prev_i != w_t can tell
them apart. Every expected trajectory below is full-batch gradient descent on least squares
written in float64 numpy, independent of the code under test.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from client_app.round import client_round
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.feddyn import H_LOCAL
from fedinit.methods.packed_arrays import unpack
from fedinit.store.client_store import W_PREV, ClientStore
from testbeds.lsq_problem import Federation, VectorModel, half_mse, lsq_problem

DIM, N, K, LR, BETA = 4, 6, 5, 0.1, 0.5
RNG = np.random.default_rng(7)
X = RNG.standard_normal((N, DIM))
Y = RNG.standard_normal(N)
W_T = RNG.standard_normal(DIM)
W_PREV_I = W_T + RNG.standard_normal(DIM)  # far from w_t: s_i and w_t differ by ~0.5
H_I = 0.3 * RNG.standard_normal(DIM)
TOL = 1e-5


def cfg(method: str, variant: str, **raw: Any) -> RunConfig:
    """Full batch (batch-size > n: one step per epoch), K steps, no decay, clip or lr decay."""
    return RunConfig.parse({"method": method, "beta": BETA, "ri-aggregation": variant,
                            "lr": LR, "local-epochs": K, "batch-size": 1000,
                            "weight-decay": 0.0, "clip-norm": 0.0, "lr-decay": 1.0,
                            "output-dir": "/tmp/unused", **raw})


def f32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def descend(start: np.ndarray, centre: np.ndarray, coef: float,
            h: np.ndarray | None = None) -> np.ndarray:
    """K full-batch steps on 0.5 mean((Xw - y)^2) + (coef/2) ||w - centre||^2 [+ coef <w, h>].

    Inputs are the float32 values the client sees, computed in float64.
    """
    x, y = f32(X).astype(np.float64), f32(Y).astype(np.float64)
    w = start.astype(np.float64)
    for _ in range(K):
        g = x.T @ (x @ w - y) / N + coef * (w - centre)
        if h is not None:
            g = g + coef * h
        w = w - LR * g
    return w


def ri_start() -> np.ndarray:
    """s_i = w_t + beta (w_t - w_prev_i), from the float32 values on the wire."""
    w_t, w_prev = f32(W_T).astype(np.float64), f32(W_PREV_I).astype(np.float64)
    return w_t + BETA * (w_t - w_prev)


def run_client(c: RunConfig, state: dict[str, np.ndarray]) -> tuple[np.ndarray, ClientStore]:
    """One participation in round 2 through ``client_round``; returns the upload and state."""
    store = ClientStore(RecordDict())
    for key, value in state.items():
        store.put(key, [f32(value)])
    round_config = {rk.ROUND: 2, rk.LR: LR, rk.BETA: BETA,
                    rk.UPLOAD_DELTA: c.train.ri_aggregation == "update"}
    received = RecordDict({rk.ARRAYS: ArrayRecord([f32(W_T)]),
                           rk.CONFIG: ConfigRecord(round_config)})
    reply = client_round(
        c, c.spec.client(c.params), received, store, VectorModel(W_T, True),
        torch.from_numpy(f32(X)), torch.from_numpy(f32(Y)),
        initial=lambda: pytest.fail("w_0 must not be rebuilt: w_prev is stored"),
        partition_id=0, loss_fn=half_mse)
    assert reply[rk.METRICS][rk.NUM_STEPS] == K
    return unpack(reply[rk.ARRAYS])[0], store


def assert_distinguishable(right: np.ndarray, wrong: np.ndarray) -> None:
    """The test's own power: centre w_t would move the result far beyond the tolerance."""
    assert np.abs(right - wrong).max() > 1000 * TOL


@pytest.mark.parametrize("variant", ["model", "update"])
def test_fedprox_centre_is_the_ri_start(variant: str) -> None:
    """Guards FedProx's prox term mu (w - s_i): the centre is s_i, not w_t."""
    mu = 1.0
    s = ri_start()
    want_final = descend(s, s, mu)
    assert_distinguishable(want_final, descend(s, f32(W_T).astype(np.float64), mu))
    up, store = run_client(cfg("fedprox", variant, **{"prox-mu": mu}), {W_PREV: W_PREV_I})
    want_up = want_final if variant == "model" else want_final - s
    np.testing.assert_allclose(up, want_up, rtol=0, atol=TOL)
    stored = store.get(W_PREV)
    assert stored is not None
    np.testing.assert_allclose(stored[0], want_final, rtol=0, atol=TOL)


@pytest.mark.parametrize("variant", ["model", "update"])
def test_feddyn_centre_and_h_update_use_the_ri_start(variant: str) -> None:
    """Guards FedDyn's client: gradient g + alpha (w - s_i) + alpha h_i, and
    h_i <- h_i + (w_iK - s_i); both with the RI start s_i, not w_t."""
    alpha = 0.7
    s = ri_start()
    h = f32(H_I).astype(np.float64)
    want_final = descend(s, s, alpha, h)
    assert_distinguishable(want_final, descend(s, f32(W_T).astype(np.float64), alpha, h))
    up, store = run_client(cfg("feddyn", variant, **{"feddyn-alpha": alpha}),
                           {W_PREV: W_PREV_I, H_LOCAL: H_I})
    want_up = want_final if variant == "model" else want_final - s
    np.testing.assert_allclose(up, want_up, rtol=0, atol=TOL)
    h_new = store.get(H_LOCAL)
    assert h_new is not None
    want_h = h + want_final - s
    assert_distinguishable(want_h, h + want_final - f32(W_T))  # h_i from w_t would differ
    np.testing.assert_allclose(h_new[0], want_h, rtol=0, atol=TOL)


def test_fedprox_with_ri_over_three_rounds_matches_a_numpy_federation() -> None:
    """Guards the whole loop (server sends w_t, client keeps w_prev_i, builds s_i, prox to
    s_i, uploads w_iK, server averages): an independent numpy FedProx + RI reference."""
    p = lsq_problem(num_clients=3, dim=DIM, n=N, seed=1)
    mu, beta, rounds = 0.5, 0.5, 3
    f = Federation(p, {"method": "fedprox", "prox-mu": mu, "beta": beta,
                       "ri-aggregation": "model", "fraction-train": 1.0, "lr": LR,
                       "local-epochs": K, "batch-size": 1000, "weighting": "uniform"})
    xs = [x.double().numpy() for x in p.xs]
    ys = [y.double().numpy() for y in p.ys]

    def reference(centre_is_start: bool) -> np.ndarray:
        w = p.w0.astype(np.float64)
        prev = [w.copy() for _ in xs]
        for _ in range(rounds):
            finals = []
            for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
                s = w + beta * (w - prev[i])
                centre = s if centre_is_start else w
                v = s.copy()
                for _ in range(K):
                    v = v - LR * (x.T @ (x @ v - y) / len(y) + mu * (v - centre))
                finals.append(v)
            prev = finals
            w = np.mean(finals, axis=0)
        return w

    want = reference(True)
    assert np.abs(want - reference(False)).max() > 1e-3
    np.testing.assert_allclose(f.run(rounds), want, rtol=0, atol=1e-5)

