"""FedRelax's warm start (``relax-warmup``) through the real server and client code: a numpy
replay of the warm-up's FedAvg rounds and of GTVMin's local steps from the warm model, the
messages of each phase, the closed form of eq. (58) reached from the warm model, and the
config's refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedinit.config import ConfigError, RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.fedrelax import OWN, START, WARMUP
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.weights import unstacked
from testbeds.lsq_problem import NODE_BASE, Federation, Problem
from tests.test_fedrelax import (
    TWO_CLUSTERS,
    fedrelax,
    gtvmin_closed_form,
    neighbours,
    own_models,
    regression,
    rel_gap,
    write_graph,
)

NBRS = neighbours(TWO_CLUSTERS)
"""TWO_CLUSTERS by client: (neighbour, A_ij)."""
LR, EPOCHS, ALPHA = 0.05, 4, 0.3


def grad(p: Problem, cid: int, w: np.ndarray) -> np.ndarray:
    """The gradient of test_fedrelax's L_i(w) = (1/m_i) ||y_i - X_i w||^2, float64."""
    x, y = p.xs[cid].double().numpy(), p.ys[cid].double().numpy()
    return 2.0 * x.T @ (x @ w - y) / len(y)


def local_steps(p: Problem, cid: int, start: np.ndarray, pull: float = 0.0,
                anchor: np.ndarray | None = None) -> np.ndarray:
    """EPOCHS full-batch steps (batch-size 1000 > 20 points) of L_i + (pull / 2)||w - anchor||^2."""
    w = start.astype(np.float64)
    for _ in range(EPOCHS):
        g = grad(p, cid, w)
        if anchor is not None:
            g = g + pull * (w - anchor)
        w = w - LR * g
    return w


def neighbourhood(own: dict[int, np.ndarray], cid: int) -> tuple[np.ndarray, float]:
    """(m_i, d_i) of eq. (123) from the clients' current models."""
    d = sum(a for _, a in NBRS[cid])
    return sum(a * own[j] for j, a in NBRS[cid]) / d, d


def gtvmin_round(f: Federation, own: dict[int, np.ndarray],
                 ) -> list[tuple[int, dict[str, list[np.ndarray]], np.ndarray, float]]:
    """Runs a GTVMin round of ``f``: each client sent a message (``sent_by_client``), the
    message, and its (m_i, d_i) from ``own``, after checking it carries m_i, not the warm-up
    flag."""
    f.step()
    out = []
    for cid, got in sent_by_client(f).items():
        m_i, d = neighbourhood(own, cid)
        np.testing.assert_allclose(got["model"][0], m_i, atol=1e-5)
        assert got["warmup"][0][0] == 0.0
        out.append((cid, got, m_i, d))
    return out


def warm_federation(p: Problem, tmp_path: Path, warmup: int, **raw: object) -> Federation:
    return fedrelax(p, write_graph(tmp_path, TWO_CLUSTERS), ALPHA,
                    **{"lr": LR, "local-epochs": EPOCHS, "relax-warmup": warmup, **raw})


def sent_by_client(f: Federation) -> dict[int, dict[str, list[np.ndarray]]]:
    """Each message of the round just run: the model, the warm-up flag and the start."""
    out = {}
    for m in f.sent:
        recs = m.content.array_records
        out[m.metadata.dst_node_id - NODE_BASE] = {
            "model": unpack(recs[rk.ARRAYS]), "warmup": unpack(recs[WARMUP]),
            "start": unstacked(unpack(recs[START]))}
    return out


def test_warmup_is_fedavg_then_gtvmin_starts_every_client_from_the_warm_model(
        tmp_path: Path) -> None:
    """Full participation, 3 warm-up rounds, then 3 GTVMin rounds: every figure against a
    numpy replay (FedAvg's uniform mean of E local steps; then eq. (123)'s E steps of
    L_i + alpha d_i ||w - m_i||^2 from the warm model)."""
    p = regression(6)
    f = warm_federation(p, tmp_path, 3)
    w = p.w0.astype(np.float64)
    for _ in range(3):
        f.step()
        msgs = sent_by_client(f)
        for got in msgs.values():  # every client is sent the shared model, flagged
            np.testing.assert_allclose(got["model"][0], w, atol=1e-6)
            assert got["warmup"][0][0] == 1.0 and got["start"] == []
        w = np.mean([local_steps(p, cid, w) for cid in range(6)], axis=0)
        np.testing.assert_allclose(f.weights, w, atol=1e-5)
        assert all(f.state_of(cid, OWN) is None for cid in range(6))  # no w^(i) yet
    warm = w
    own = {cid: warm.copy() for cid in range(6)}
    for rnd in range(3):
        new = {}
        for cid, got, m_i, d in gtvmin_round(f, own):
            if rnd == 0:  # no upload since the warm-up: the warm model to start from
                assert len(got["start"]) == 1
                np.testing.assert_allclose(got["start"][0][0], warm, atol=1e-6)
            else:
                assert got["start"] == []
            new[cid] = local_steps(p, cid, own[cid], 2 * ALPHA * d, m_i)
        own = new
        np.testing.assert_allclose(own_models(f), np.stack([own[i] for i in range(6)]),
                                   atol=1e-5)
        np.testing.assert_allclose(f.weights, np.mean(list(own.values()), axis=0), atol=1e-5)
    assert rel_gap(own_models(f), np.tile(warm, (6, 1))) > 0.01  # GTVMin moved them apart


def test_a_client_first_sampled_after_the_warmup_starts_from_the_warm_model(
        tmp_path: Path) -> None:
    """Half the clients a round: a client's first GTVMin participation starts from the warm
    model (sent as ``fedrelax-start``), not from m_i, even when its neighbours have moved;
    the start is sent until it uploads, and never again."""
    p = regression(6)
    f = warm_federation(p, tmp_path, 2, **{"fraction-train": 0.5})
    f.run(2)
    warm = f.weights.astype(np.float64)
    own = {cid: warm.copy() for cid in range(6)}
    uploaded: set[int] = set()
    checked_moved = False
    for _ in range(6):
        new = {}
        for cid, got, m_i, d in gtvmin_round(f, own):
            assert len(got["start"]) == (0 if cid in uploaded else 1)
            if cid not in uploaded:
                np.testing.assert_allclose(got["start"][0][0], warm, atol=1e-6)
                checked_moved |= rel_gap(m_i, warm) > 0.01  # m_i is not the warm model
            new[cid] = local_steps(p, cid, own[cid], 2 * ALPHA * d, m_i)
        own.update(new)
        uploaded |= set(new)
        for cid in new:
            np.testing.assert_allclose(f.state_of(cid, OWN)[0], own[cid], atol=1e-5)
    assert checked_moved and uploaded == set(range(6))


def test_from_the_warm_model_fedrelax_still_reaches_the_gtvmin_closed_form(
        tmp_path: Path) -> None:
    """The warm start changes where GTVMin starts, not its solution (eq. (58))."""
    p = regression(6)
    f = fedrelax(p, write_graph(tmp_path, TWO_CLUSTERS), ALPHA, **{"relax-warmup": 5})
    f.run(45)
    assert rel_gap(own_models(f), gtvmin_closed_form(p, TWO_CLUSTERS, ALPHA)) < 2e-5


def test_the_knn_graph_is_built_from_the_warmups_moves(tmp_path: Path) -> None:
    """Under ``graph=knn`` the first graph is built at the warm-up's last round from the moves
    of the shared model (two regimes: no edge across them), not at round 1."""
    from tests.test_fedrelax import two_regimes

    f = fedrelax(two_regimes(), "knn", 0.3, **{"graph-k": 2, "lr": 0.05, "relax-warmup": 2})
    f.run(1)
    assert len(f.strategy.state.graph[0]) == 0  # type: ignore[attr-defined]
    f.run(1)
    edges = f.strategy.state.graph[0]  # type: ignore[attr-defined]
    assert len(edges) >= 8 and set(edges.ravel()) == set(range(8))
    assert all((i < 4) == (j < 4) for i, j in edges), edges


def test_relax_warmup_refusals() -> None:
    with pytest.raises(ConfigError, match=r"^run config: relax-warmup=-1 is not allowed; "
                                          r"allowed: an integer >= 0"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "relax-warmup": -1})
    with pytest.raises(ConfigError, match=r"relax-warmup=2 is not allowed; allowed: 0 with "
                                          r"method='fedrelax'"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "relax-warmup": 2,
                         "rounds": "async", "graph": "file:/tmp/g.txt"})


def test_warm_model_equals_a_fedavg_run(tmp_path: Path) -> None:
    """The warm-up is FedAvg exactly: the same rounds of method=fedavg end on the same model."""
    p = regression(6)
    f = warm_federation(p, tmp_path, 3, **{"fraction-train": 0.5})
    g = Federation(p, {"method": "fedavg", "beta": 0.0, "lr": LR, "local-epochs": EPOCHS,
                       "batch-size": 1000, "fraction-train": 0.5, "weighting": "uniform"})
    np.testing.assert_array_equal(f.run(3), g.run(3))
