"""FedRelax through the real server and client code (``testbeds.lsq_problem.Federation``): the
GTVMin closed form of the book's eq. (58) for linear regression, a round by hand on a 3-client
graph, what each message carries, and the learned graph on two regimes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedinit.config import ConfigError, RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.fedrelax import DEGREE, OWN
from fedinit.methods.packed_arrays import unpack
from testbeds.lsq_problem import Federation, Problem, lsq_optimum, quadratic_problem

Edges = list[tuple[int, int, float]]
CHAIN: Edges = [(0, 1, 1.0), (1, 2, 1.0), (2, 3, 1.0)]
TWO_CLUSTERS: Edges = [(0, 1, 1.0), (0, 2, 0.5), (1, 2, 2.0), (3, 4, 1.0), (3, 5, 1.0),
                       (4, 5, 1.0)]


def mse(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The book's L_i(w) = (1/m_i) ||y_i - X_i w||^2."""
    return torch.mean((pred - y) ** 2)


def regression(num_clients: int, seed: int = 0) -> Problem:
    """Client i: 20 points x ~ N(0, I_3), y = x w*_i + noise, w*_i its own (heterogeneous)."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for _ in range(num_clients):
        x = rng.standard_normal((20, 3))
        y = x @ (2.0 * rng.standard_normal(3)) + 0.1 * rng.standard_normal(20)
        xs.append(torch.from_numpy(x.astype(np.float32)))
        ys.append(torch.from_numpy(y.astype(np.float32)))
    return Problem(xs, ys, np.zeros(3, dtype=np.float32), True, mse)


def write_graph(tmp_path: Path, edges: Edges) -> str:
    path = tmp_path / "graph.txt"
    path.write_text("# i j weight\n" + "\n".join(f"{i} {j} {a}" for i, j, a in edges) + "\n")
    return f"file:{path}"


def neighbours(edges: Edges) -> dict[int, list[tuple[int, float]]]:
    """Each client's (neighbour, A_ij), in the edges' order: a by-hand replay's view of the
    same graph the server reads from ``write_graph``'s file."""
    out: dict[int, list[tuple[int, float]]] = {}
    for i, j, a in edges:
        out.setdefault(i, []).append((j, a))
        out.setdefault(j, []).append((i, a))
    return out


def gtvmin_closed_form(p: Problem, edges: Edges, alpha: float) -> np.ndarray:
    """Eq. (58): w = -1/2 Q^-1 q, Q = blockdiag(X_i^T X_i / m_i) + alpha L (x) I,
    q = -2 (X_i^T y_i / m_i) stacked; one row per client."""
    n, d = p.num_clients, len(p.w0)
    lap = np.zeros((n, n))
    for i, j, a in edges:
        lap[i, i] += a
        lap[j, j] += a
        lap[i, j] -= a
        lap[j, i] -= a
    q_mat = np.kron(alpha * lap, np.eye(d))
    q = np.zeros(n * d)
    for i, (x, y) in enumerate(zip(p.xs, p.ys, strict=True)):
        xd, yd = x.double().numpy(), y.double().numpy()
        q_mat[i * d:(i + 1) * d, i * d:(i + 1) * d] += xd.T @ xd / len(xd)
        q[i * d:(i + 1) * d] = -2.0 * xd.T @ yd / len(xd)
    return (-0.5 * np.linalg.solve(q_mat, q)).reshape(n, d)


def own_models(f: Federation) -> np.ndarray:
    return np.stack([f.state_of(cid, OWN)[0] for cid in range(f.problem.num_clients)])


def fedrelax(p: Problem, graph: str, alpha: float, **raw: object) -> Federation:
    return Federation(p, {"method": "fedrelax", "beta": 0.0, "fedrelax-alpha": alpha,
                          "graph": graph, "lr": 0.2, "local-epochs": 10, "batch-size": 1000,
                          "fraction-train": 1.0, "weighting": "uniform", **raw})


def rel_gap(w: np.ndarray, target: np.ndarray) -> float:
    return float(np.abs(w - target).max() / np.abs(target).max())


# ---------------------------------------------------------------- the closed form
@pytest.mark.parametrize(("edges", "alpha"), [(CHAIN, 0.5), (TWO_CLUSTERS, 0.3)],
                         ids=["chain", "two-clusters"])
def test_fedrelax_reaches_the_gtvmin_closed_form(edges: Edges, alpha: float,
                                                 tmp_path: Path) -> None:
    n = 1 + max(max(i, j) for i, j, _ in edges)
    p = regression(n)
    f = fedrelax(p, write_graph(tmp_path, edges), alpha)
    f.run(25)  # within 2e-5 after 15-18 rounds, at float32's floor (under 1/200 of it) from 24
    oracle = gtvmin_closed_form(p, edges, alpha)
    assert rel_gap(own_models(f), oracle) < 2e-5
    # and the answer is not one a graph-blind method would give
    assert rel_gap(gtvmin_closed_form(p, [], 1.0), oracle) > 0.05


def test_alpha_zero_is_each_clients_own_least_squares(tmp_path: Path) -> None:
    p = regression(4)
    f = fedrelax(p, write_graph(tmp_path, CHAIN), 0.0)
    f.run(15)
    for cid in range(4):
        own = lsq_optimum(Problem([p.xs[cid]], [p.ys[cid]], p.w0, True, mse))
        assert rel_gap(own_models(f)[cid], own) < 2e-5


def test_large_alpha_tends_to_the_pooled_least_squares(tmp_path: Path) -> None:
    """The closed form moves to the pooled solution as alpha grows (within 0.1% at 1e4 on
    the chain); FedRelax run at a larger alpha ends nearer to it (its rounds to converge grow
    like alpha / the smallest curvature, docs/algorithms.md, so a fast test stops at 2)."""
    p = regression(4)
    pooled = lsq_optimum(p)
    gaps = [rel_gap(gtvmin_closed_form(p, CHAIN, a), pooled[None]) for a in (0.1, 10, 1e4)]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-3, gaps
    graph = write_graph(tmp_path, CHAIN)
    ended = [rel_gap(_run_own(fedrelax(p, graph, a, lr=0.1), 15), pooled[None])
             for a in (0.1, 2.0)]
    assert ended[1] < 0.5 * ended[0], ended  # 1.34 and 4.45 (at 40 rounds: 1.32 and 4.45)


def _run_own(f: Federation, rounds: int) -> np.ndarray:
    f.run(rounds)
    return own_models(f)


# ---------------------------------------------------------------- by hand, 3 clients
def test_a_fedrelax_round_by_hand_on_three_clients(tmp_path: Path) -> None:
    """f_i(w) = 0.5 ||w - a_i||^2; edges 0-1 (A = 2) and 1-2 (A = 1). One step per round:
    w <- w - lr ((w - a_i) + 2 alpha d_i (w - m_i)), from the client's own model."""
    targets = [[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]]
    p = quadratic_problem(targets, [0.5, 0.5])
    lr, alpha = 0.1, 0.4
    f = Federation(p, {"method": "fedrelax", "beta": 0.0, "fedrelax-alpha": alpha,
                       "graph": write_graph(tmp_path, [(0, 1, 2.0), (1, 2, 1.0)]), "lr": lr,
                       "local-epochs": 1, "batch-size": 1, "fraction-train": 1.0})
    a = np.asarray(targets)
    w = np.tile(np.asarray([0.5, 0.5]), (3, 1))  # every own model starts at w_0
    nbrs = {0: [(1, 2.0)], 1: [(0, 2.0), (2, 1.0)], 2: [(1, 1.0)]}
    for _ in range(3):
        f.step()
        sent = {m.metadata.dst_node_id - 1000: m.content for m in f.sent}
        terms = {}
        for i, edges in nbrs.items():
            d = sum(wt for _, wt in edges)
            m_i = sum(wt * w[j] for j, wt in edges) / d
            got = unpack(sent[i].array_records[rk.ARRAYS])[0]
            np.testing.assert_allclose(got, m_i, atol=1e-6)  # the neighbourhood term
            assert unpack(sent[i].array_records[DEGREE])[0][0] == d
            terms[i] = (m_i, d)
        w = np.stack([w[i] - lr * ((w[i] - a[i]) + 2 * alpha * d * (w[i] - m_i))
                      for i, (m_i, d) in terms.items()])
        np.testing.assert_allclose(own_models(f), w, atol=1e-6)
    assert np.abs(w - 0.5).min() > 1e-3  # the models moved


def test_no_client_receives_a_model_of_a_client_it_is_not_linked_to(tmp_path: Path) -> None:
    """Client 2 has no edge: it gets its own model back; 0 and 1 get each other's (their one
    neighbour, weight 3), never client 2's."""
    p = quadratic_problem([[1.0], [2.0], [5.0]], [0.0])
    f = Federation(p, {"method": "fedrelax", "beta": 0.0, "fedrelax-alpha": 0.5,
                       "graph": write_graph(tmp_path, [(0, 1, 3.0)]), "lr": 0.1,
                       "local-epochs": 1, "batch-size": 1, "fraction-train": 1.0})
    f.run(2)
    before = own_models(f)
    f.step()
    got = {m.metadata.dst_node_id - 1000: unpack(m.content.array_records[rk.ARRAYS])[0]
           for m in f.sent}
    np.testing.assert_array_equal(got[0], before[1])
    np.testing.assert_array_equal(got[1], before[0])
    np.testing.assert_array_equal(got[2], before[2])
    assert not np.array_equal(got[0], before[2]) and not np.array_equal(got[1], before[2])
    assert {unpack(m.content.array_records[DEGREE])[0][0]
            for m in f.sent} == {3.0, 0.0}


# ---------------------------------------------------------------- the learned graph
def two_regimes(n: int = 8, seed: int = 3) -> Problem:
    """Clients 0..n/2-1 regress on w* = +u, the others on w* = -u (plus noise)."""
    rng = np.random.default_rng(seed)
    u = np.asarray([2.0, -1.0, 1.5, 0.5])
    xs, ys = [], []
    for i in range(n):
        x = rng.standard_normal((20, 4))
        y = x @ (u if i < n // 2 else -u) + 0.1 * rng.standard_normal(20)
        xs.append(torch.from_numpy(x.astype(np.float32)))
        ys.append(torch.from_numpy(y.astype(np.float32)))
    return Problem(xs, ys, np.zeros(4, dtype=np.float32), True, mse)


def test_the_learned_graph_links_only_clients_of_the_same_regime(tmp_path: Path) -> None:
    f = fedrelax(two_regimes(), "knn", 0.3, **{"graph-k": 2, "lr": 0.05})
    f.strategy.bind_run_dir(tmp_path)
    f.run(3)
    edges = f.strategy.state.graph[0]  # type: ignore[attr-defined]
    assert len(edges) >= 8
    assert all((i < 4) == (j < 4) for i, j in edges), edges
    assert set(edges.ravel()) == set(range(8))  # every client has a neighbour
    written = json.loads((tmp_path / "graph.json").read_text())
    assert written["round"] == 1 and written["edges"] == [[int(i), int(j), 1.0]
                                                          for i, j in edges]
    assert (tmp_path / "graph.png").stat().st_size > 0


def test_fedrelax_refuses_ri_and_dp_and_a_bad_graph() -> None:
    with pytest.raises(ConfigError, match=r"beta=0.1 is not allowed; allowed: 0 with "):
        RunConfig.parse({"method": "fedrelax", "beta": 0.1})
    with pytest.raises(ConfigError, match=r"dp='central' is not allowed; allowed: off with"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "dp": "central",
                         "weighting": "uniform", "dp-clip": 1.0, "dp-noise-multiplier": 1.0})
    with pytest.raises(ConfigError, match=r"graph='nearest' is not allowed"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "graph": "nearest"})
    with pytest.raises(ConfigError, match=r"graph-k=0 is not allowed"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "graph-k": 0})
