"""Ditto against rounds worked out by hand, and its two limits.

The setup of tests/test_methods_by_hand.py: three clients, f_i(w) = 0.5 * ||w - a_i||^2,
w_0 = (0, 0), lr 0.5, K = 2 local steps, clients 0 and 1 sampled in rounds 1 and 2. With
lambda = 0.5 a personal step is v <- v - 0.5 * ((v - a_i) + 0.5 * (v - w_t))
= 0.25 v + 0.5 a_i + 0.25 w_t.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedinit.methods.ditto import PERSONAL
from fedinit.methods.packed_arrays import unpack
from fedinit.store.client_store import W_PREV
from testbeds.lsq_problem import Federation, lsq_problem, quadratic_problem

A = [[2.0, 0.0], [0.0, 4.0], [-3.0, 1.0]]
BASE = {"lr": 0.5, "local-epochs": 2, "batch-size": 1, "fraction-train": 0.67, "seed": 3,
        "method": "ditto", "ditto-lambda": 0.5}


def fed(**raw: Any) -> Federation:
    return Federation(quadratic_problem(A, [0.0, 0.0]), {**BASE, **raw})


def close(actual: Any, expected: list[float]) -> None:
    np.testing.assert_allclose(np.asarray(actual, dtype=np.float64).ravel(), expected,
                               rtol=0, atol=1e-6)


def test_ditto_two_rounds_by_hand() -> None:
    f = fed()
    assert f.step() == [0, 1]
    close(f.weights, [0.75, 1.5])  # the global half is FedAvg's
    # v starts at w_0 = (0, 0): c0 (1, 0) -> (1.25, 0); c1 (0, 2) -> (0, 2.5)
    close(f.state_of(0, PERSONAL), [1.25, 0.0])
    close(f.state_of(1, PERSONAL), [0.0, 2.5])
    assert f.state_of(2, PERSONAL) is None  # never trained: no personal model
    f.step()
    close(f.weights, [0.9375, 1.875])
    # w_1 = (.75, 1.5); c0: (1.25, 0) -> (1.5, .375) -> (1.5625, .46875)
    close(f.state_of(0, PERSONAL), [1.5625, 0.46875])
    # c1: (0, 2.5) -> (.1875, 3) -> (.234375, 3.125)
    close(f.state_of(1, PERSONAL), [0.234375, 3.125])
    close(f.state_of(0, W_PREV), [1.6875, 0.375])  # the global pass's final model


def test_ditto_composes_with_ri() -> None:
    f = fed(beta=0.5)
    f.run(2)
    # the global pass starts from the relaxed point (FedInit's numbers in test_methods_by_hand)
    close(f.state_of(0, W_PREV), [1.59375, 0.5625])
    # the personal pass is anchored on the received w_t, not on the relaxed start
    close(f.state_of(0, PERSONAL), [1.5625, 0.46875])


def test_ditto_lambda_zero_is_local_training() -> None:
    f = fed(**{"ditto-lambda": 0.0})
    f.run(2)
    # plain steps y <- 0.5 y + 0.5 a from v: c0 (0,0) -> (1,0) -> (1.5,0) -> (1.75,0) -> (1.875,0)
    close(f.state_of(0, PERSONAL), [1.875, 0.0])


def _run(method: str, lam: float, lr: float) -> Federation:
    f = Federation(lsq_problem(num_clients=6, dim=4, n=10, seed=1),
                   {"method": method, "ditto-lambda": lam, "lr": lr, "local-epochs": 20,
                    "batch-size": 5, "fraction-train": 0.5, "seed": 2})
    return f



def test_ditto_global_model_is_fedavgs_and_large_lambda_pins_v_to_it() -> None:
    """Ditto's global model is FedAvg's bit for bit; as lambda grows, v_i tends to the global
    model w_t the client received, by a small fraction of the move FedAvg's local model makes."""
    lr, rounds = 0.002, 3
    avg = _run("fedavg", 0.0, lr)
    avg.run(rounds - 1)
    w_received = avg.weights.copy()  # the global model sent in the last round
    last = avg.step()
    moves = {r.metadata.src_node_id - 1000: float(np.linalg.norm(
        unpack(r.content.array_records["arrays"])[0] - w_received))
        for r in avg.replies}
    errors: dict[float, dict[int, float]] = {}
    for lam in (50.0, 500.0):
        d = _run("ditto", lam, lr)
        d.run(rounds)
        np.testing.assert_array_equal(d.weights, avg.weights)  # bit for bit, any lambda
        errors[lam] = {cid: float(np.linalg.norm(d.state_of(cid, PERSONAL)[0] - w_received))
                       for cid in last}
    for cid in last:
        assert errors[500.0][cid] < 0.05 * moves[cid], (cid, errors, moves)
    assert max(errors[500.0].values()) < max(errors[50.0].values()) / 5  # about 1 / lambda
