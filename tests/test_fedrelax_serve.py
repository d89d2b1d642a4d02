"""What FedRelax serves a client in personalized evaluation (``relax-serve``, issue 45 item 3),
through the real server and client code against a hand computation: ``mean`` (m_i, the train
message's model), ``own`` (w^(i) counted beside its neighbours) and ``chosen`` (w^(i) and its
own lowest-loss choice only); training is the same under every rule."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from flwr.app import ConfigRecord

from fedinit.config import ConfigError, RunConfig
from fedinit.methods import graph_loss as gl
from fedinit.methods import wire as rk
from fedinit.methods.fedrelax import FedRelaxState
from fedinit.methods.packed_arrays import unpack
from testbeds.lsq_problem import NODE_BASE, Federation, quadratic_problem
from tests.test_fedrelax import write_graph
from tests.test_fedrelax_server_step import step_with

TARGETS = [[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0], [2.0, 2.0]]
"""f_i(w) = 0.5 ||w - a_i||^2; every model starts at (0.5, 0.5)."""
AFTER_ROUND_1 = np.asarray([[0.55, 0.45], [0.45, 0.65], [0.35, 0.35], [0.65, 0.65]])
"""Round 1, every client trains one step of lr 0.1 with no neighbour yet (degree 0, or the
given graph's pull at w = m = (0.5, 0.5), which is 0): w_i = 0.9 (0.5, 0.5) + 0.1 a_i."""


def federation(serve: str, graph: str, over: dict[str, Any] | None = None,
               targets: list[list[float]] = TARGETS) -> Federation:
    """FedRelax of alpha 0.4 on f_i(w) = 0.5 ||w - a_i||^2 (a_i: ``targets``) from (0.5, 0.5),
    one step of lr 0.1 a round, every client evaluated each round; ``over``: other keys."""
    return Federation(quadratic_problem(targets, [0.5, 0.5]), {
        "method": "fedrelax", "beta": 0.0, "fedrelax-alpha": 0.4, "graph": graph,
        "graph-k": 2, "lr": 0.1, "local-epochs": 1, "batch-size": 1, "fraction-train": 1.0,
        "personal-eval-every": 1, "personal-eval-clients": 0, "relax-serve": serve,
        **(over or {})})


def served(f: Federation) -> dict[int, np.ndarray]:
    """The model each client's personalized-evaluation message carries, by client."""
    messages = f.strategy.personal_eval.messages(f.round, f.arrays, ConfigRecord())
    return {m.metadata.dst_node_id - NODE_BASE: unpack(m.content.array_records[rk.ARRAYS])[0]
            for m in messages}


@pytest.mark.parametrize(("serve", "expected"), [
    # client 0's neighbours 1 and 2: m_0 = (w1 + w2) / 2; client 3 has none: its own model
    ("mean", [[0.4, 0.5], [0.55, 0.45], [0.55, 0.45], [0.65, 0.65]]),
    # (w_i + sum_j A_ij w_j) / (1 + d_i): client 0 (0.55 + 0.45 + 0.35, 0.45 + 0.65 + 0.35) / 3
    ("own", [[0.45, 1.45 / 3], [0.5, 0.55], [0.45, 0.4], [0.65, 0.65]]),
])
def test_mean_and_own_on_a_given_graph(tmp_path: Path, serve: str,
                                       expected: list[list[float]]) -> None:
    f = federation(serve, write_graph(tmp_path, [(0, 1, 1.0), (0, 2, 1.0)]))
    f.step()
    np.testing.assert_allclose(
        np.stack([f.strategy.rule.model_of(f.strategy.state, i)[0]  # type: ignore[attr-defined]
                  for i in range(4)]), AFTER_ROUND_1, atol=1e-6)
    got = served(f)
    np.testing.assert_allclose(np.stack([got[i] for i in range(4)]), expected, atol=1e-6)


def test_chosen_serves_the_clients_own_choice_not_those_that_chose_it() -> None:
    """Round 1 measures nothing; then by hand: 0 chose 1, 1 chose 0, 2 chose 0 and 3 chose
    nothing; the union graph gives 0 the neighbours 1 and 2. ``chosen``: client 0 gets (w0 +
    w1) / 2 = (0.5, 0.55) (not 2, which only chose it), client 2 (w2 + w0) / 2 = (0.45, 0.4),
    client 3 (no choice, no edge) its own model; ``own`` on the same state gives 0 the three."""
    results = {}
    for serve in ("chosen", "own"):
        f = federation(serve, gl.SOURCE)
        f.step()
        state = cast(FedRelaxState, f.strategy.state)
        chosen = np.asarray([[1, gl.NONE], [0, gl.NONE], [0, gl.NONE], [gl.NONE, gl.NONE]])
        f.strategy.method.state = dataclasses.replace(  # type: ignore[attr-defined]
            state, chosen=[chosen], graph=gl.union_graph(chosen))
        got = served(f)
        results[serve] = np.stack([got[i] for i in range(4)])
    np.testing.assert_allclose(results["chosen"], [[0.5, 0.55], [0.5, 0.55], [0.45, 0.4],
                                                   [0.65, 0.65]], atol=1e-6)
    np.testing.assert_allclose(results["own"][0], [0.45, 1.45 / 3], atol=1e-6)


@pytest.mark.parametrize(("serve", "expected"), [
    ("mean", [[0.5, 0.525]] * 4),  # no edge yet: the warm model, the mean of the four uploads
    ("own", AFTER_ROUND_1.tolist()),  # each its own warm-up upload
    ("chosen", AFTER_ROUND_1.tolist()),
])
def test_a_client_without_an_edge_is_served_its_warm_up_upload(serve: str,
                                                                expected: list[list[float]]
                                                                ) -> None:
    """``relax-warmup=1`` under ``graph=loss``: round 1 is FedAvg from (0.5, 0.5), every
    client's upload w_i = AFTER_ROUND_1 is kept as its candidate model, no edge exists yet.
    ``mean`` serves m_i = the client's server copy, the warm model (0.5, 0.525); ``own`` and
    ``chosen`` serve the upload its own data taught."""
    f = federation(serve, gl.SOURCE, {"relax-warmup": 1})
    f.step()
    got = served(f)
    np.testing.assert_allclose(np.stack([got[i] for i in range(4)]), expected, atol=1e-6)


@pytest.mark.parametrize(("serve", "expected"), [
    ("mean", [0.45, 0.59]),  # m_3 with no edge: its server copy, the warm model W
    ("own", [1.605 / 3, 1.631 / 3]),  # its upload with client 0 and 0's neighbour 2
    ("chosen", [1.605 / 3, 1.631 / 3]),  # its upload with client 0 and 0's choice 2
])
def test_a_client_no_one_chose_is_served_with_the_client_its_model_fits_best(
        serve: str, expected: list[float]) -> None:
    """Five clients, a = (1, 0), (0, 2), (-1, -1), (3, 3), (-3, 3), ``relax-warmup=1``,
    ``graph-k=1``. Round 1 (warm-up, all): uploads p_i = 0.9 (0.5, 0.5) + 0.1 a_i, W = their
    mean = (0.45, 0.59). Round 2, only 0 and 1 reply. Client 0 scores p1, p2, p3, p4 on its
    data: 0.3625, 0.2725, 0.3125, 0.6425, chooses 2; client 1 scores p0, p2, p3, p4: 1.3525,
    1.4225, 1.0625, 0.7925, chooses 4. Edges 0-2 and 1-4; client 3 has none, and its model
    p3 = (0.75, 0.75) fit client 0's data best (0.3125 < 1.0625). Client 0's upload, one step
    from W with no neighbour yet: u0 = 0.9 W + 0.1 a_0 = (0.505, 0.531). Client 3 is served
    (p3 + u0 + p2) / 3 under ``own`` and ``chosen``."""
    targets = [[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0], [3.0, 3.0], [-3.0, 3.0]]
    f = federation(serve, gl.SOURCE, {"relax-warmup": 1, "graph-k": 1}, targets)
    f.step()
    step_with(f, {0, 1})
    state = cast(FedRelaxState, f.strategy.state)
    np.testing.assert_array_equal(state.chosen[0][:2, 0], [2, 4])
    np.testing.assert_allclose(state.nearest[0][:, 0], [2, 1, 1, 1, 1])  # 1 + the client
    np.testing.assert_allclose(state.nearest[0][3, 1], 0.3125, atol=1e-6)
    np.testing.assert_allclose(served(f)[3], expected, atol=1e-6)


def test_training_is_the_same_under_every_rule(tmp_path: Path) -> None:
    """Only the evaluation message changes: three rounds give the same global model."""
    graph = write_graph(tmp_path, [(0, 1, 1.0), (0, 2, 1.0), (2, 3, 2.0)])
    runs = {serve: federation(serve, graph).run(3) for serve in ("mean", "own", "chosen")}
    np.testing.assert_array_equal(runs["own"], runs["mean"])
    np.testing.assert_array_equal(runs["chosen"], runs["mean"])


def test_relax_serve_refusal() -> None:
    with pytest.raises(ConfigError, match=r"relax-serve='best' is not allowed; "
                                          r"allowed: mean \| own \| chosen"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "relax-serve": "best"})


def test_the_report_row_names_the_serve_rule() -> None:
    from fedinit.scripts.personal_report import row_label

    base = {"method": "fedrelax", "beta": 0.0, "graph": "loss", "relax-warmup": 10,
            "relax-server-step": 1.0, "relax-server-rule": "moves"}
    assert row_label(base) == "FedRelax (learned graph: loss, warm-up 10, server step moves 1)"
    assert row_label({**base, "relax-serve": "mean"}) == row_label(base)
    assert row_label({**base, "relax-serve": "chosen"}) == (
        "FedRelax (learned graph: loss, warm-up 10, server step moves 1, serve chosen)")
    assert row_label({**base, "relax-serve": "chosen", "fedrelax-alpha": 0.02}) == (
        "FedRelax (learned graph: loss, warm-up 10, server step moves 1, alpha 0.02, "
        "serve chosen)")
