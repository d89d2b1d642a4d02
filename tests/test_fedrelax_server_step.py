"""FedRelax's server-side neighbourhood step (``relax-server-step`` beta, issue 45) through the
real server and client code: two rounds by hand on three clients under each rule (``mean``
and ``moves``), the book's GTVMin closed form (eq. (58)) of a network whose data-less clients
never train (the server's steps solve their part), FedRelax unchanged when every client
trains, and the refusals."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
import pytest
import torch
from flwr.common import ConfigRecord
from flwr.server import Grid

from fedinit.config import ConfigError, RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.fedrelax import DEGREE, OWN, START
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.weights import unstacked
from testbeds.lsq_problem import NODE_BASE, Federation, Problem, quadratic_problem
from tests.test_fedrelax import (
    TWO_CLUSTERS,
    fedrelax,
    gtvmin_closed_form,
    own_models,
    regression,
    rel_gap,
    write_graph,
)


def step_with(f: Federation, trained: set[int]) -> dict[int, dict[str, np.ndarray]]:
    """One round in which only the clients in ``trained`` reply (the others' messages are
    lost); returns each message's model, degree and start, by client."""
    f.round += 1
    messages = list(f.strategy.configure_train(f.round, f.arrays, ConfigRecord(),
                                               cast(Grid, None)))
    sent = {}
    for m in messages:
        recs = m.content.array_records
        start = unstacked(unpack(recs[START]))
        sent[m.metadata.dst_node_id - NODE_BASE] = {
            "model": unpack(recs[rk.ARRAYS])[0], "degree": unpack(recs[DEGREE])[0],
            "start": start[0][0] if start else None}
    replies = [f.answer(m) for m in messages if m.metadata.dst_node_id - NODE_BASE in trained]
    new, _ = f.strategy.aggregate_train(f.round, replies)
    if new is not None:
        f.arrays = new
    return sent


def server_copies(f: Federation, n: int) -> np.ndarray:
    rule, state = f.strategy.rule, f.strategy.state  # type: ignore[attr-defined]
    return np.stack([rule.model_of(state, cid)[0] for cid in range(n)])


def test_two_rounds_by_hand_on_three_clients(tmp_path: Path) -> None:
    """f_i(w) = 0.5 ||w - a_i||^2, a = (1, 0), (0, 2), (-1, -1); edges 0-1 (A = 2), 1-2
    (A = 1); lr 0.1, alpha 0.4, beta 0.5, one local step; every model starts at (0.5, 0.5).

    Round 1, only client 0 trains: m_0 = (0.5, 0.5), so w0 = w - 0.1 (w - a_0) = (0.55, 0.45).
    Then the server steps 1 and 2 from the models after that reply: m_1 = (2 (0.55, 0.45) +
    (0.5, 0.5)) / 3 = (1.6, 1.4) / 3, w1 = 0.5 (0.5, 0.5) + 0.5 m_1 = (1.55, 1.45) / 3;
    m_2 = w1 before its step = (0.5, 0.5): w2 unchanged. The global model is their mean.

    Round 2, only client 1 trains, from the server's copy s = (1.55, 1.45) / 3 (sent as its
    start), m_1 = (1.6, 1.4) / 3, d_1 = 3: w1 = s - 0.1 ((s - a_1) + 2 (0.4) 3 (s - m_1))
    = (0.469, 0.631). Then w0 = 0.5 (0.55, 0.45) + 0.5 w1 = (0.5095, 0.5405) and
    w2 = 0.5 (0.5, 0.5) + 0.5 w1 = (0.4845, 0.5655)."""
    p = quadratic_problem([[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]], [0.5, 0.5])
    f = Federation(p, {"method": "fedrelax", "beta": 0.0, "fedrelax-alpha": 0.4,
                       "graph": write_graph(tmp_path, [(0, 1, 2.0), (1, 2, 1.0)]), "lr": 0.1,
                       "local-epochs": 1, "batch-size": 1, "fraction-train": 1.0,
                       "relax-server-step": 0.5})
    sent = step_with(f, {0})
    np.testing.assert_allclose(sent[0]["model"], [0.5, 0.5], atol=1e-7)
    np.testing.assert_allclose(sent[0]["start"], [0.5, 0.5], atol=1e-7)  # w_0: its copy
    round1 = np.asarray([[0.55, 0.45], [1.55 / 3, 1.45 / 3], [0.5, 0.5]])
    np.testing.assert_allclose(server_copies(f, 3), round1, atol=1e-6)
    np.testing.assert_allclose(f.weights, round1.mean(axis=0), atol=1e-6)

    sent = step_with(f, {1})
    np.testing.assert_allclose(sent[1]["start"], [1.55 / 3, 1.45 / 3], atol=1e-6)
    np.testing.assert_allclose(sent[1]["model"], [1.6 / 3, 1.4 / 3], atol=1e-6)
    assert sent[1]["degree"][0] == 3.0
    round2 = np.asarray([[0.5095, 0.5405], [0.469, 0.631], [0.4845, 0.5655]])
    np.testing.assert_allclose(server_copies(f, 3), round2, atol=1e-6)
    np.testing.assert_allclose(f.weights, round2.mean(axis=0), atol=1e-6)
    # the clients hold the model of their last participation; the server's copy is newer
    np.testing.assert_allclose(f.state_of(1, OWN)[0], [0.469, 0.631], atol=1e-6)
    np.testing.assert_allclose(f.state_of(0, OWN)[0], [0.55, 0.45], atol=1e-6)
    assert f.state_of(2, OWN) is None


def test_the_moves_rule_by_hand_on_three_clients(tmp_path: Path) -> None:
    """``relax-server-rule=moves``, beta 1, the problem of the test above. Round 1, only
    client 0 trains: its move (0.05, -0.05); client 1 (neighbours 0 and 2, only 0 trained)
    takes it: (0.55, 0.45); client 2 (neighbour 1 did not train) stays at (0.5, 0.5).
    Round 2, only client 1 trains from s = (0.55, 0.45), m_1 = (1.6, 1.4) / 3, d_1 = 3:
    w1 = s - 0.1 ((s - a_1) + 2.4 (s - m_1)) = s - 0.1 (0.59, -1.59) = (0.491, 0.609), its
    move (-0.059, 0.159); clients 0 and 2 take it: (0.491, 0.609) and (0.441, 0.659)."""
    p = quadratic_problem([[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]], [0.5, 0.5])
    f = Federation(p, {"method": "fedrelax", "beta": 0.0, "fedrelax-alpha": 0.4,
                       "graph": write_graph(tmp_path, [(0, 1, 2.0), (1, 2, 1.0)]), "lr": 0.1,
                       "local-epochs": 1, "batch-size": 1, "fraction-train": 1.0,
                       "relax-server-step": 1.0, "relax-server-rule": "moves"})
    step_with(f, {0})
    round1 = np.asarray([[0.55, 0.45], [0.55, 0.45], [0.5, 0.5]])
    np.testing.assert_allclose(server_copies(f, 3), round1, atol=1e-6)
    sent = step_with(f, {1})
    np.testing.assert_allclose(sent[1]["start"], [0.55, 0.45], atol=1e-6)
    round2 = np.asarray([[0.491, 0.609], [0.491, 0.609], [0.441, 0.659]])
    np.testing.assert_allclose(server_copies(f, 3), round2, atol=1e-6)
    np.testing.assert_allclose(f.weights, round2.mean(axis=0), atol=1e-6)


def without_data(p: Problem, silent: set[int]) -> Problem:
    """``p`` with L_i = 0 for the clients in ``silent`` (X_i = 0, y_i = 0)."""
    xs = [torch.zeros_like(x) if i in silent else x for i, x in enumerate(p.xs)]
    ys = [torch.zeros_like(y) if i in silent else y for i, y in enumerate(p.ys)]
    return Problem(xs, ys, p.w0, p.linear, p.loss_fn)


def test_clients_that_never_train_reach_the_gtvmin_closed_form(tmp_path: Path) -> None:
    """Clients 2 and 5 never reply (no data: L_i = 0); the others train every round; beta 1.
    The fixed point is GTVMin's (eq. (58)) with X_2 = X_5 = 0: a trained client's local
    problem is its block of the gradient, and a silent client's step w <- w + beta (m_i - w)
    stops exactly where its block, 2 alpha d_i (w - m_i), is zero (relative gap 1e-6 after 20
    rounds, at float32's floor from 27)."""
    p, silent, alpha = regression(6), {2, 5}, 0.3
    oracle = gtvmin_closed_form(without_data(p, silent), TWO_CLUSTERS, alpha)
    f = fedrelax(p, write_graph(tmp_path, TWO_CLUSTERS), alpha, **{"relax-server-step": 1.0})
    for _ in range(20):
        step_with(f, set(range(6)) - silent)
    assert rel_gap(server_copies(f, 6), oracle) < 1e-5
    # without the step the silent clients would stay at w_0 = 0, far from their models here
    assert np.abs(oracle[[2, 5]]).max() > 0.3 * np.abs(oracle).max()
    # and the oracle is not the one of the network in which every client has its data
    assert rel_gap(gtvmin_closed_form(p, TWO_CLUSTERS, alpha), oracle) > 0.1


def test_when_every_client_trains_the_step_changes_nothing(tmp_path: Path) -> None:
    """No client is left to step: the run equals FedRelax's without the key, bit for bit."""
    p = regression(6)
    graph = write_graph(tmp_path, TWO_CLUSTERS)
    on = fedrelax(p, graph, 0.3, **{"relax-server-step": 1.0})
    off = fedrelax(p, graph, 0.3)
    np.testing.assert_array_equal(on.run(3), off.run(3))
    np.testing.assert_array_equal(own_models(on), own_models(off))


def test_relax_server_step_refusals() -> None:
    with pytest.raises(ConfigError, match=r"^run config: relax-server-step=1.5 is not "
                                          r"allowed; allowed: a number in \[0, 1\]"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "relax-server-step": 1.5})
    with pytest.raises(ConfigError, match=r"relax-server-rule='all' is not allowed; "
                                          r"allowed: mean \| moves"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "relax-server-rule": "all"})
    with pytest.raises(ConfigError, match=r"relax-server-step=0.5 is not allowed; allowed: "
                                          r"0 with method='fedrelax' with rounds='async'"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "relax-server-step": 0.5,
                         "rounds": "async", "graph": "file:/tmp/g.txt"})


def test_the_report_row_names_the_server_step() -> None:
    from fedinit.scripts.personal_report import row_label

    base = {"method": "fedrelax", "beta": 0.0, "graph": "loss", "relax-warmup": 10}
    assert row_label(base) == "FedRelax (learned graph: loss, warm-up 10)"
    assert row_label({**base, "relax-server-step": 1.0, "relax-server-rule": "moves"}) == (
        "FedRelax (learned graph: loss, warm-up 10, server step moves 1)")
