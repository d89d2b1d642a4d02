"""FedRelax's loss-learned graph (``graph=loss``) through the real server and client code on
two synthetic regimes: no cross-regime edge, GTVMin on the learned graph reaches eq. (58)'s
closed form for that graph, the losses are the candidates' mean losses on the client's own
data and all that leaves besides the update, and hostile loss replies are rejected."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from flwr.app import ConfigRecord
from flwr.serverapp import Grid

from fedinit.config import ConfigError, RunConfig
from fedinit.methods import graph_loss as gl
from fedinit.methods import wire as rk
from fedinit.methods.fedrelax import DEGREE, FedRelaxState
from fedinit.methods.packed_arrays import unpack
from testbeds.lsq_problem import NODE_BASE, Federation
from tests.test_clustered import answer_with, message_for
from tests.test_fedrelax import fedrelax, gtvmin_closed_form, own_models, rel_gap, two_regimes


def state_of(f: Federation) -> FedRelaxState:
    return cast(FedRelaxState, f.strategy.state)


def learned_edges(f: Federation) -> list[tuple[int, int, float]]:
    edges, weights = state_of(f).graph
    return [(int(i), int(j), float(a)) for (i, j), a in zip(edges, weights, strict=True)]


def test_the_loss_graph_has_no_cross_regime_edge_and_gtvmin_reaches_its_closed_form(
        tmp_path: Path) -> None:
    p = two_regimes()
    alpha = 0.3
    f = fedrelax(p, "loss", alpha, **{"graph-k": 2, "graph-refresh-every": 1000})
    f.strategy.bind_run_dir(tmp_path)
    f.run(1)
    assert learned_edges(f) == []  # nothing measured in round 1
    f.step()
    for msg in f.sent:  # round 2: every other client's model to score, 7 losses up
        cid = msg.metadata.dst_node_id - NODE_BASE
        ids = unpack(msg.content.array_records[gl.CANDIDATE_IDS])[0]
        assert ids.tolist() == [j for j in range(8) if j != cid]
        assert unpack(msg.content.array_records[gl.CANDIDATES])[0].shape == (7, 4)
    for reply in f.replies:
        assert len([k for k in reply.content.metric_records[rk.METRICS]
                    if k.startswith(gl.LOSS_PREFIX)]) == 7
    edges = learned_edges(f)
    assert edges and all((i < 4) == (j < 4) for i, j, _ in edges), edges
    assert {i for e in edges for i in e[:2]} == set(range(8))  # every client linked
    chosen = state_of(f).chosen[0]
    assert all(len(set(row)) == 2 and all((j < 4) == (i < 4) for j in row)
               for i, row in enumerate(chosen))
    written = json.loads((tmp_path / "graph.json").read_text())
    assert written["round"] == 2 and written["source"] == "loss"
    assert written["edges"] == [list(e) for e in edges]
    f.step()
    for msg in f.sent:  # not due again: nothing to score
        assert unpack(msg.content.array_records[gl.CANDIDATE_IDS])[0].shape == (0,)
        assert unpack(msg.content.array_records[gl.CANDIDATES])[0].shape == (0, 4)
    f.run(25)  # within 2e-5 after 12 more rounds, at float32's floor (1/128 of it) after 20
    assert learned_edges(f) == edges  # fixed since round 2
    oracle = gtvmin_closed_form(p, edges, alpha)
    assert rel_gap(own_models(f), oracle) < 2e-5
    complete = [(i, j, 1.0) for i in range(8) for j in range(i + 1, 8)]
    assert rel_gap(gtvmin_closed_form(p, complete, alpha), oracle) > 0.05  # the graph matters


def test_a_client_measures_again_after_graph_refresh_every_rounds() -> None:
    f = fedrelax(two_regimes(), "loss", 0.3, **{"graph-k": 2, "graph-refresh-every": 3})
    counts = []
    for _ in range(6):
        f.step()
        counts.append(sum(len(unpack(m.content.array_records[gl.CANDIDATE_IDS])[0]) > 0
                          for m in f.sent))
    assert counts == [0, 8, 0, 0, 8, 0]  # rounds 2 and 5
    assert state_of(f).measured[0].tolist() == [5] * 8


def test_candidates_are_all_with_a_model_or_the_choice_plus_a_seeded_sample() -> None:
    version = np.asarray([1, 1, 0, 1, 1, 1, 1, 1, 1, 1], dtype=np.int64)
    chosen = np.full((10, 2), gl.NONE, dtype=np.int64)
    chosen[0] = [5, 9]
    assert gl.candidates(0, version, chosen, 8, 3).tolist() == [1, 3, 4, 5, 6, 7, 8, 9]
    few = gl.candidates(0, version, chosen, 4, 3)
    assert len(few) == 4 and {5, 9} <= set(few.tolist()) and not {0, 2} & set(few.tolist())
    assert gl.candidates(0, version, chosen, 4, 3).tolist() == few.tolist()  # seeded
    other = {tuple(gl.candidates(0, version, chosen, 4, r).tolist()) for r in range(3, 13)}
    assert len(other) > 1  # the sample changes with the round


def test_the_losses_are_measured_on_the_clients_own_data_and_all_that_leaves() -> None:
    p = two_regimes()
    f = fedrelax(p, "loss", 0.3, **{"graph-k": 2})
    f.run(1)
    f.round = 1
    f.sent = list(f.strategy.configure_train(2, f.arrays, ConfigRecord(), cast(Grid, None)))
    msg = message_for(f, 0)
    ids = unpack(msg.content.array_records[gl.CANDIDATE_IDS])[0]
    models = unpack(msg.content.array_records[gl.CANDIDATES])[0]
    own = answer_with(f, msg, data_of=0)
    other = answer_with(f, msg, data_of=5)  # the same message, client 5's data in its hands
    x, y = p.xs[0].double().numpy(), p.ys[0].double().numpy()
    metrics = own.metric_records[rk.METRICS]
    for j, w in zip(ids, models, strict=True):  # the book's L_i(w^(j)), batch = all 20
        want = np.mean((x @ w.astype(np.float64) - y) ** 2)
        assert metrics[gl.loss_key(int(j))] == pytest.approx(want, rel=1e-5)
    mine = [metrics[gl.loss_key(int(j))] for j in ids]
    theirs = [other.metric_records[rk.METRICS][gl.loss_key(int(j))] for j in ids]
    assert np.argsort(mine)[:2].tolist() != np.argsort(theirs)[:2].tolist()
    assert set(own.array_records) == {rk.ARRAYS}  # the update; no other model
    assert set(own.metric_records) == {rk.METRICS}
    assert set(metrics) == {rk.NUM_EXAMPLES, rk.TRAIN_LOSS, rk.NUM_STEPS,
                            rk.COMPUTE_SECONDS, *(gl.loss_key(int(j)) for j in ids)}
    assert dict(own.config_records[rk.CONFIG]) == {rk.UPLOAD_DELTA: False}


def hostile(metrics: dict[str, object], how: str) -> None:
    key = gl.loss_key(3)
    if how == "missing":
        del metrics[key]
    elif how == "unknown":
        metrics[gl.loss_key(0)] = 0.0  # the client itself: not a candidate
    elif how == "stranger":
        metrics[gl.loss_key(99)] = 0.0
    else:
        metrics[key] = {"nan": float("nan"), "inf": float("inf"), "list": [0.1, 0.2]}[how]


@pytest.mark.parametrize(("how", "reason"), [
    ("missing", "missing metric 'fedrelax-loss-3' (the loss of that candidate's model on the "
                "client's data; candidates: 1, 2, 3, 4, 5, 6, 7)"),
    ("unknown", "metric 'fedrelax-loss-0' is not the loss of a candidate this client was "
                "sent (candidates: 1, 2, 3, 4, 5, 6, 7)"),
    ("stranger", "metric 'fedrelax-loss-99' is not the loss of a candidate this client was "
                 "sent (candidates: 1, 2, 3, 4, 5, 6, 7)"),
    ("nan", "fedrelax-loss-3=nan is not a finite number"),
    ("inf", "fedrelax-loss-3=inf is not a finite number"),
    ("list", "fedrelax-loss-3=[0.1, 0.2] is not a finite number"),
])
def test_a_hostile_loss_reply_is_rejected_with_one_line_and_not_used(how: str,
                                                                      reason: str) -> None:
    f = fedrelax(two_regimes(), "loss", 0.3, **{"graph-k": 2})
    f.run(1)
    f.round = 2
    f.sent = list(f.strategy.configure_train(2, f.arrays, ConfigRecord(), cast(Grid, None)))
    replies = [f.answer(m) for m in f.sent]
    zero = next(r for r in replies if r.metadata.src_node_id == NODE_BASE)
    hostile(zero.content.metric_records[rk.METRICS], how)  # type: ignore[arg-type]
    assert f.strategy.decode(zero) == reason
    _, counts = f.strategy.aggregate_train(2, replies)
    assert counts is not None and counts[rk.NUM_REJECTED] == 1 and counts[rk.NUM_REPLIES] == 7
    after = state_of(f)
    assert after.chosen[0][0].tolist() == [gl.NONE, gl.NONE]  # not used
    assert after.measured[0][0] == 0 and after.measured[0][1:].tolist() == [2] * 7


def test_losses_for_a_client_sent_no_candidates_are_rejected() -> None:
    f = fedrelax(two_regimes(), "loss", 0.3, **{"graph-k": 2})
    f.step()  # round 1: no candidates
    reply = f.replies[0]
    reply.content.metric_records[rk.METRICS][gl.loss_key(1)] = 0.5
    assert f.strategy.decode(reply) == ("metric 'fedrelax-loss-1' is not the loss of a "
                                        "candidate this client was sent (candidates: none)")


def test_no_candidates_for_knn_or_a_file_graph_and_graph_loss_keys_are_checked() -> None:
    f = fedrelax(two_regimes(), "knn", 0.3, **{"graph-k": 2})
    f.run(3)
    for msg in f.sent:
        assert unpack(msg.content.array_records[gl.CANDIDATE_IDS])[0].shape == (0,)
        assert unpack(msg.content.array_records[DEGREE])[0].shape == (1,)
    with pytest.raises(ConfigError, match=r"^run config: graph-candidates=2 is not allowed; "
                       r"allowed: an integer >= graph-k \(3\)$"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "graph": "loss",
                         "graph-candidates": 2})
    with pytest.raises(ConfigError, match=r"allowed: knn \| loss \| file:"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "graph": "losses"})


def test_union_graph_and_choice_rules() -> None:
    chosen = np.asarray([[1, 2], [0, gl.NONE], [gl.NONE, gl.NONE], [2, 0]], dtype=np.int64)
    edges, weights = gl.union_graph(chosen)
    assert edges.tolist() == [[0, 1], [0, 2], [0, 3], [2, 3]] and weights.tolist() == [1.0] * 4
    metrics = {gl.loss_key(1): 0.5, gl.loss_key(4): 0.45, gl.loss_key(7): 0.5,
               gl.loss_key(8): 0.8}
    sent = np.asarray([8, 7, 1, 4])
    assert gl.choice(metrics, sent, 2).tolist() == [1, 4]  # tie: the lower id
    assert gl.choice(metrics, sent, 5).tolist() == [1, 4, 7, -1, -1]  # none past the gap
    metrics[gl.loss_key(4)] = 0.1  # now the widest gap is below 4's loss
    assert gl.choice(metrics, sent, 3).tolist() == [4, -1, -1]
    two = {gl.loss_key(1): 0.5, gl.loss_key(2): 3.0}
    assert gl.choice(two, np.asarray([1, 2]), 2).tolist() == [1, 2]  # too few to split
    assert gl.lower_group(np.asarray([1.0, 1.1, 1.2, 5.0, 5.1])) == 3
    far = np.asarray([1.0, 1.1, 1.2, 2.0, 2.1, 4.0, 4.1])  # own, near, far groups
    assert gl.lower_group(far) == 5 and gl.lower_group(far, 4) == 3
    sent = np.arange(7)
    losses = {gl.loss_key(j): float(v) for j, v in zip(sent, far[::-1], strict=True)}
    assert gl.choice(losses, sent, 2).tolist() == [5, 6]  # span 4: the near group is out
    assert gl.lower_group(np.asarray([1.0, 1.0, 1.0])) == 1  # no gap: the first



def test_a_client_measures_when_due_or_when_more_candidates_are_available() -> None:
    measured = np.asarray([0, 2, 2], dtype=np.int64)
    pool = np.asarray([0, 5, 5], dtype=np.int64)
    assert not gl.due(measured, pool, 0, 1, 5, 0)  # round 1: no model to score
    assert not gl.due(measured, pool, 0, 3, 5, 0)  # nobody else has a model
    assert gl.due(measured, pool, 0, 3, 5, 2)  # never measured
    assert gl.due(measured, pool, 9, 3, 5, 2)  # a client the state has not grown to yet
    assert not gl.due(measured, pool, 1, 4, 5, 5)  # measured at 2 among as many
    assert gl.due(measured, pool, 1, 4, 5, 6)  # more candidates than its choice saw
    assert gl.due(measured, pool, 2, 7, 5, 5)  # 5 rounds since
    version = np.asarray([3, 0, 1, 2], dtype=np.int64)
    assert gl.available(0, version, 32) == 2 and gl.available(1, version, 32) == 3
    assert gl.available(1, version, 2) == 2


def test_graph_purity_counts_the_edges_inside_one_regime(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    from fedinit.scripts.graph_purity import main

    (tmp_path / "regimes.csv").write_text("partition-id,regime\n0,0\n1,0\n2,1\n3,1\n4,1\n")
    (tmp_path / "graph.json").write_text(json.dumps(
        {"round": 7, "source": "loss", "num-clients": 5,
         "edges": [[0, 1, 1.0], [1, 2, 1.0], [2, 3, 1.0]]}))
    assert main([str(tmp_path)]) == 0
    assert capsys.readouterr().out == (f"{tmp_path.name}: graph=loss after round 7: 2 of 3 "
                                       "edges inside one regime; 1 clients without an edge\n")
    (tmp_path / "graph.json").unlink()
    with pytest.raises(ValueError, match="needs graph.json and regimes.csv"):
        main([str(tmp_path)])
