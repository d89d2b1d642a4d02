"""FedRelax's loss-learned graph after a warm start (``graph=loss`` with ``relax-warmup``)
through the real server and client code on two synthetic least-squares regimes: the warm-up's
uploads (each client's w_iK, trained from the shared model on its own data) are the candidate
models of round R+1's measurements, checked against a numpy replay; the learned graph has no
cross-regime edge and GTVMin on it reaches eq. (58)'s closed form; a client scored by its
warm-up model is scored by its own model once it uploads; hostile loss replies are rejected."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import numpy as np
from flwr.app import ConfigRecord, Message
from flwr.serverapp import Grid

from fedinit.methods import graph_loss as gl
from fedinit.methods import wire as rk
from fedinit.methods.fedrelax import OWN, FedRelaxState
from fedinit.methods.packed_arrays import unpack
from testbeds.lsq_problem import NODE_BASE, Federation, Problem
from tests.test_fedrelax import fedrelax, gtvmin_closed_form, own_models, rel_gap, two_regimes

LR, EPOCHS, ALPHA, WARMUP = 0.2, 10, 0.3, 2
"""test_fedrelax's settings (full-batch steps: batch-size 1000 > 20 points)."""


def state_of(f: Federation) -> FedRelaxState:
    return cast(FedRelaxState, f.strategy.state)


def learned_edges(f: Federation) -> list[tuple[int, int, float]]:
    edges, weights = state_of(f).graph
    return [(int(i), int(j), float(a)) for (i, j), a in zip(edges, weights, strict=True)]


def warm_loss(**raw: object) -> Federation:
    return fedrelax(two_regimes(), "loss", ALPHA, **{
        "graph-k": 2, "graph-refresh-every": 1000, "relax-warmup": WARMUP, **raw})


def local_steps(p: Problem, cid: int, start: np.ndarray) -> np.ndarray:
    """EPOCHS full-batch steps of L_i(w) = (1/m_i) ||X_i w - y_i||^2 from ``start`` (float64)."""
    x, y = p.xs[cid].double().numpy(), p.ys[cid].double().numpy()
    w = start.astype(np.float64)
    for _ in range(EPOCHS):
        w = w - LR * 2.0 * x.T @ (x @ w - y) / len(y)
    return w


def mse(p: Problem, cid: int, w: np.ndarray) -> float:
    x, y = p.xs[cid].double().numpy(), p.ys[cid].double().numpy()
    return float(np.mean((x @ w.astype(np.float64) - y) ** 2))


def candidates_of(msg: Message) -> tuple[int, list[int], np.ndarray]:
    """(client, candidate ids, candidate models (M, dim)) of one train message."""
    recs = msg.content.array_records
    return (msg.metadata.dst_node_id - NODE_BASE, unpack(recs[gl.CANDIDATE_IDS])[0].tolist(),
            unpack(recs[gl.CANDIDATES])[0])


def replay_warmup(f: Federation, rounds: int) -> dict[int, np.ndarray]:
    """Run the warm-up's rounds, replaying FedAvg in numpy; each client's last w_iK."""
    p = f.problem
    w = p.w0.astype(np.float64)
    last: dict[int, np.ndarray] = {}
    for _ in range(rounds):
        trained = f.step()
        for msg in f.sent:  # warm-up rounds measure nothing
            assert candidates_of(msg)[1] == []
        moves = {cid: local_steps(p, cid, w) for cid in trained}
        last.update(moves)
        w = np.mean(list(moves.values()), axis=0)
        np.testing.assert_allclose(f.weights, w, atol=1e-5)
    return last


def test_round_r_plus_1_scores_the_warmups_uploads_and_the_graph_is_pure_and_reaches_eq58(
        ) -> None:
    """Full participation: in round R+1 every client scores the 7 others' last warm-up
    models (numpy's replay), reports numpy's mean squared error of each on its own data, and
    the union of the choices links every client inside its regime only; GTVMin on that graph
    then reaches eq. (58)'s closed form for it."""
    f = warm_loss()
    p = f.problem
    warm_models = replay_warmup(f, WARMUP)
    assert learned_edges(f) == []
    f.step()  # round R+1
    for msg in f.sent:
        cid, ids, models = candidates_of(msg)
        assert ids == [j for j in range(8) if j != cid]
        np.testing.assert_allclose(models, np.stack([warm_models[j] for j in ids]), atol=1e-5)
    for reply in f.replies:
        cid = reply.metadata.src_node_id - NODE_BASE
        metrics = reply.content.metric_records[rk.METRICS]
        for j in (j for j in range(8) if j != cid):
            want = mse(p, cid, warm_models[j])
            assert metrics[gl.loss_key(j)] == approx(want)
    edges = learned_edges(f)
    assert edges and all((i < 4) == (j < 4) for i, j, _ in edges), edges
    assert {i for e in edges for i in e[:2]} == set(range(8))  # every client linked
    assert state_of(f).measured[0].tolist() == [WARMUP + 1] * 8
    assert state_of(f).probe[0].tolist() == [0] * 8  # all uploaded: scored by their own
    f.run(25)
    assert learned_edges(f) == edges  # fixed since round R+1
    oracle = gtvmin_closed_form(p, edges, ALPHA)
    assert rel_gap(own_models(f), oracle) < 2e-5
    complete = [(i, j, 1.0) for i in range(8) for j in range(i + 1, 8)]
    assert rel_gap(gtvmin_closed_form(p, complete, ALPHA), oracle) > 0.05  # the graph matters


def approx(want: float) -> object:
    import pytest

    return pytest.approx(want, rel=1e-5)


def test_candidates_are_the_clients_the_warmup_trained_then_their_own_uploads() -> None:
    """Half the clients a round: round R+1's candidates are exactly the other clients the
    warm-up trained, each by its last warm-up upload; a client that has uploaded since is
    scored by that upload (its w^(i)), and no cross-regime edge appears on the way."""
    f = warm_loss(**{"fraction-train": 0.5, "relax-warmup": 3})
    warm_models = replay_warmup(f, 3)
    trained = set(warm_models)
    assert 0 < len(trained) < 8  # the seeded sample leaves someone out: a real check
    own: dict[int, np.ndarray] = {}
    scored_by_own = 0
    for _ in range(4):
        f.step()
        for msg in f.sent:
            cid, ids, models = candidates_of(msg)
            if not ids:
                continue
            assert ids == sorted((trained | set(own)) - {cid})
            scored_by_own += len(set(ids) & set(own))
            for j, model in zip(ids, models, strict=True):
                np.testing.assert_allclose(model, own[j] if j in own else warm_models[j],
                                           atol=1e-5)
        for msg in f.sent:
            cid = msg.metadata.dst_node_id - NODE_BASE
            own[cid] = cast(list[np.ndarray], f.state_of(cid, OWN))[0].astype(np.float64)
        assert all((i < 4) == (j < 4) for i, j, _ in learned_edges(f)), learned_edges(f)
    assert scored_by_own > 0  # both kinds of candidate model were checked
    probe = state_of(f).probe[0]
    assert [cid for cid in range(8) if probe[cid] > 0] == sorted(trained - set(own))


def test_a_hostile_loss_reply_in_round_r_plus_1_is_rejected_and_not_used() -> None:
    f = warm_loss()
    f.run(WARMUP)
    f.round = WARMUP + 1
    f.sent = list(f.strategy.configure_train(f.round, f.arrays, ConfigRecord(),
                                             cast(Grid, None)))
    replies = [f.answer(m) for m in f.sent]
    zero = next(r for r in replies if r.metadata.src_node_id == NODE_BASE)
    del zero.content.metric_records[rk.METRICS][gl.loss_key(3)]
    assert f.strategy.decode(zero) == (
        "missing metric 'fedrelax-loss-3' (the loss of that candidate's model on the client's "
        "data; candidates: 1, 2, 3, 4, 5, 6, 7)")
    _, counts = f.strategy.aggregate_train(f.round, replies)
    assert counts is not None and counts[rk.NUM_REJECTED] == 1
    after = state_of(f)
    assert after.chosen[0][0].tolist() == [gl.NONE, gl.NONE]  # not used
    assert after.measured[0][0] == 0 and after.probe[0][0] == WARMUP  # still its warm model


def test_the_warmup_stores_its_uploads_only_under_graph_loss(tmp_path: Path) -> None:
    """Under a given graph the warm-up keeps no client model (as before); under ``loss`` it
    keeps each client's last warm-up upload, and no more than two files a client after."""
    from tests.test_fedrelax import TWO_CLUSTERS, write_graph

    given = fedrelax(two_regimes(6), write_graph(tmp_path, TWO_CLUSTERS), ALPHA,
                     **{"relax-warmup": WARMUP})
    for name in ("given", "loss"):
        (tmp_path / name).mkdir()
    given.strategy.bind_run_dir(tmp_path / "given")
    given.run(WARMUP)
    assert state_of(given).probe[0].size == 0
    assert not list((tmp_path / "given" / "server-models").glob("*/r*.npz"))
    f = warm_loss()
    f.strategy.bind_run_dir(tmp_path / "loss")
    f.run(WARMUP)
    assert state_of(f).probe[0].tolist() == [WARMUP] * 8
    root = tmp_path / "loss" / "server-models"
    files = lambda cid: sorted(p.name for p in (root / str(cid)).glob("r*.npz"))  # noqa: E731
    assert all(files(cid) == ["r1.npz", "r2.npz"] for cid in range(8))
    f.run(2)  # the first upload keeps the warm-up's file, the second drops it
    assert all(files(cid) == ["r3.npz", "r4.npz"] for cid in range(8))


def test_a_checkpoint_from_before_probe_resumes_with_none() -> None:
    """A FedRelax checkpoint written before ``probe`` existed loads with an empty one (that
    code kept no warm-up upload as a candidate), every other field as saved; a checkpoint
    with a field FedRelaxState does not know is still refused."""
    f = warm_loss()
    f.run(WARMUP + 1)
    saved = state_of(f).arrays()
    assert state_of(f).probe[0].size > 0  # this run kept warm-up uploads
    old = {k: v for k, v in saved.items() if k != "probe"}
    loaded = cast(FedRelaxState, FedRelaxState.from_arrays(old))
    assert loaded.probe[0].size == 0 and loaded.probe[0].dtype == np.int64
    for name, arrays in old.items():
        got = getattr(loaded, name)
        assert len(got) == len(arrays)
        assert all(np.array_equal(a, b) for a, b in zip(got, arrays, strict=True)), name
    try:
        FedRelaxState.from_arrays({**saved, "stranger": [np.zeros(1)]})
    except ValueError as err:
        assert "stranger" in str(err)
    else:
        raise AssertionError("an unknown state field was accepted")
