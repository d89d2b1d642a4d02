"""FedRelax's ``relax-groups-by=loss`` (issue 45 item 3): the graph's groups seed the membership
when the warm-up ends, then each sampled client joins the group whose model has the lowest loss
on its own data (IFCA, Ghosh et al. 2020) and the group splits when its replies' moves point
apart (CFL, Sattler et al. 2020), through the real server and client code against a numpy
computation by hand on f_i(w) = 0.5 ||w - a_i||^2; the refusals and the report label."""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from flwr.common import ConfigRecord
from flwr.server import Grid

from fedinit.config import ConfigError, RunConfig
from fedinit.methods import graph_groups as gg
from fedinit.methods import graph_loss as gl
from fedinit.methods.fedrelax import GROUP
from fedinit.methods.packed_arrays import unpack
from testbeds.lsq_problem import NODE_BASE, Federation
from tests.test_fedrelax import write_graph
from tests.test_fedrelax_groups import EXAMPLES, LR, TARGETS, W0, fedavg, local, problem
from tests.test_fedrelax_server_step import server_copies


def loss(w: np.ndarray, cid: int) -> float:
    """Client cid's mean loss of model w on its own examples (all alike)."""
    return 0.5 * float(np.sum((w - TARGETS[cid]) ** 2))


def by_loss(tmp_path: Path, edges: list[tuple[int, int, float]], **raw: object) -> Federation:
    return Federation(problem(), {
        "method": "fedrelax", "beta": 0.0, "fedrelax-alpha": 0.0, "lr": LR,
        "graph": write_graph(tmp_path, edges), "local-epochs": 1, "batch-size": 1,
        "fraction-train": 1.0, "weighting": "examples", "relax-warmup": 1,
        "relax-train": "groups", "relax-groups-by": "loss", **raw})


def messages_of(f: Federation) -> dict[int, dict[str, np.ndarray]]:
    """The last round's candidate ids and own-group position, by client."""
    out = {}
    for m in f.sent:
        recs = m.content.array_records
        out[m.metadata.dst_node_id - NODE_BASE] = {
            "ids": unpack(recs[gl.CANDIDATE_IDS])[0], "group": unpack(recs[GROUP])[0]}
    return out


def test_seeded_by_the_graph_then_each_client_joins_its_lowest_loss(tmp_path: Path) -> None:
    """Graph {0, 1}, {2, 3}; warm-up 1 round (FedAvg from w_0 = (0.5, 0.5)); margin 0.

    The warm-up's end numbers the groups 1 and 2 (0: the pool, empty). Round 2: both groups'
    models are the warm model w_1, so every loss ties and every client stays: each group's
    model becomes the example-weighted mean of its members' uploads. Round 3: each client
    scores both groups' models on its own data and trains the lowest (ties: stays); here
    clients 0 and 2 move (the hand numbers: 0 to group 2, 2 to group 1), and each group's
    model becomes the FedAvg of the replies of the clients that chose it."""
    f = by_loss(tmp_path, [(0, 1, 1.0), (2, 3, 1.0)], **{"relax-group-margin": 0.0})
    f.run(1)
    ups = {i: local(W0, i) for i in range(4)}
    w1 = W0 + sum(EXAMPLES[i] * (ups[i] - W0) for i in range(4)) / sum(EXAMPLES)
    state = f.strategy.state  # type: ignore[attr-defined]
    assert state.team[0].tolist() == [1, 1, 2, 2]
    np.testing.assert_allclose(f.weights, w1, atol=1e-6)

    f.run(1)
    sent = messages_of(f)
    for i in range(4):  # every non-empty group, and its own group's position among them
        assert sent[i]["ids"].tolist() == [1, 2]
        assert sent[i]["group"].tolist() == [0 if i < 2 else 1]
    a2 = fedavg({0: local(w1, 0), 1: local(w1, 1)})
    b2 = fedavg({2: local(w1, 2), 3: local(w1, 3)})
    np.testing.assert_allclose(server_copies(f, 4), [a2, a2, b2, b2], atol=1e-6)

    f.run(1)
    models = {1: a2, 2: b2}
    team = {}
    for i in range(4):  # the lowest loss; a tie keeps its own group
        own = 1 if i < 2 else 2
        other = 3 - own
        team[i] = other if loss(models[other], i) < loss(models[own], i) else own
    assert team == {0: 2, 1: 1, 2: 1, 3: 2}  # the hand computation has moves to check
    state = f.strategy.state  # type: ignore[attr-defined]
    assert state.team[0].tolist() == [team[i] for i in range(4)]
    a3 = fedavg({i: local(models[team[i]], i) for i in range(4) if team[i] == 1})
    b3 = fedavg({i: local(models[team[i]], i) for i in range(4) if team[i] == 2})
    np.testing.assert_allclose(server_copies(f, 4), [b3, a3, a3, b3], atol=1e-6)
    np.testing.assert_allclose(f.weights, (2 * a3 + 2 * b3) / 4, atol=1e-6)
    rule = f.strategy.rule  # type: ignore[attr-defined]
    for i, want in enumerate([b3, a3, a3, b3]):  # personalized evaluation: its group's model
        np.testing.assert_allclose(rule.evaluated_model(state, i, f.arrays)[0], want,
                                   atol=1e-6)
    # the client trained the model it chose: its own model is that model after its SGD
    np.testing.assert_allclose(f.state_of(0, "fedrelax-w")[0], local(b2, 0), atol=1e-6)


def test_the_margin_keeps_a_member_that_a_lower_loss_would_move(tmp_path: Path) -> None:
    """The same rounds with margin 0.9: client 0 moves only for a loss below 0.1 x its own
    group's, which group 2's model does not reach (the hand numbers), nor does group 1's for
    client 2, so the groups stay."""
    f = by_loss(tmp_path, [(0, 1, 1.0), (2, 3, 1.0)], **{"relax-group-margin": 0.9})
    f.run(2)
    ups = {i: local(W0, i) for i in range(4)}
    w1 = W0 + sum(EXAMPLES[i] * (ups[i] - W0) for i in range(4)) / sum(EXAMPLES)
    a2 = fedavg({0: local(w1, 0), 1: local(w1, 1)})
    b2 = fedavg({2: local(w1, 2), 3: local(w1, 3)})
    assert loss(b2, 0) < loss(a2, 0) and not loss(b2, 0) < 0.1 * loss(a2, 0)
    assert loss(a2, 2) < loss(b2, 2) and not loss(a2, 2) < 0.1 * loss(b2, 2)
    f.run(1)
    assert f.strategy.state.team[0].tolist() == [1, 1, 2, 2]  # type: ignore[attr-defined]


def test_a_margin_no_loss_beats_equals_the_graphs_groups(tmp_path: Path) -> None:
    """With a margin no client's losses pass, ``loss`` keeps the seeded groups, which on a
    given graph are ``graph``'s every round: the same models and global model."""
    edges = [(0, 1, 1.0), (2, 3, 1.0)]
    on = by_loss(tmp_path, edges, **{"relax-group-margin": 0.999})
    off = by_loss(tmp_path, edges, **{"relax-groups-by": "graph"})
    np.testing.assert_allclose(on.run(4), off.run(4), rtol=0, atol=1e-6)
    np.testing.assert_allclose(server_copies(on, 4), server_copies(off, 4), rtol=0, atol=1e-6)


def test_a_group_whose_replies_point_apart_splits(tmp_path: Path) -> None:
    """Round 2 of the first test: each group has two replies, their moves from w_1 with
    cosines c_01 (group 1) and c_23 (group 2), by hand. With the split threshold between the
    two, the group of the lower cosine splits: its reply without the round's lowest client id
    goes to a new group (3), and each half's model is the FedAvg of its own replies; the
    other group does not split. ``groups.jsonl`` logs both cosines and the split."""
    ups = {i: local(W0, i) for i in range(4)}
    w1 = W0 + sum(EXAMPLES[i] * (ups[i] - W0) for i in range(4)) / sum(EXAMPLES)
    moves = {i: local(w1, i) - w1 for i in range(4)}

    def cos(i: int, j: int) -> float:
        return float(moves[i] @ moves[j] / np.linalg.norm(moves[i]) / np.linalg.norm(moves[j]))

    c01, c23 = cos(0, 1), cos(2, 3)
    assert c01 < c23  # the numbers below: group 1 splits
    f = by_loss(tmp_path, [(0, 1, 1.0), (2, 3, 1.0)],
                **{"relax-group-split": (c01 + c23) / 2, "relax-group-margin": 0.0})
    f.strategy.bind_run_dir(tmp_path)
    f.run(2)
    state = f.strategy.state  # type: ignore[attr-defined]
    assert state.team[0].tolist() == [1, 3, 2, 2]
    b2 = fedavg({2: local(w1, 2), 3: local(w1, 3)})
    np.testing.assert_allclose(server_copies(f, 4), [local(w1, 0), local(w1, 1), b2, b2],
                               atol=1e-6)
    lines = [json.loads(x) for x in (tmp_path / "groups.jsonl").read_text().splitlines()]
    assert lines[0] == {"round": 1, "groups": [1, 1, 2, 2], "seeded": True}
    assert lines[1]["groups"] == [1, 3, 2, 2]
    assert lines[1]["cross-cosine"] == pytest.approx({"1": c01, "2": c23}, abs=1e-4)
    assert lines[1]["splits"] == [{"from": 1, "to": 3, "cross-cosine": pytest.approx(c01, abs=1e-4),
                                   "clients": [1]}]


def test_numbered_groups_put_the_pool_first() -> None:
    labels = np.asarray([0, 0, gg.POOL, 3, 3, gg.POOL, 6], dtype=np.int64)
    assert gg.numbered(labels).tolist() == [1, 1, 0, 2, 2, 0, 3]
    assert gg.numbered(np.asarray([2, 2, 0, 0])).tolist() == [2, 2, 1, 1]


def round_with(f: Federation, trained: set[int]) -> dict[int, dict[str, np.ndarray]]:
    """One round in which only the clients in ``trained`` reply; each message's candidate ids
    and own-group position, by client."""
    f.round += 1
    messages = list(f.strategy.configure_train(f.round, f.arrays, ConfigRecord(),
                                               cast(Grid, None)))
    f.sent = messages
    replies = [f.answer(m) for m in messages if m.metadata.dst_node_id - NODE_BASE in trained]
    new, _ = f.strategy.aggregate_train(f.round, replies)
    if new is not None:
        f.arrays = new
    return messages_of(f)


def test_a_newcomer_takes_the_lowest_loss_and_is_served_the_warm_model(tmp_path: Path) -> None:
    """Client 3's messages are lost in rounds 1 (the warm-up) and 2: it has never uploaded.
    Round 2 tells it so (position -1) and personalized evaluation serves it the warm model
    w_1 while client 2, its group's other member, is served group 2's model. In round 3 the
    members keep their groups (margin 0.9) while client 3 joins the group of its lowest loss
    (no margin): by hand, group 1, whose model becomes the FedAvg of 0, 1 and 3's replies."""
    f = by_loss(tmp_path, [(0, 1, 1.0), (2, 3, 1.0)], **{"relax-group-margin": 0.9})
    round_with(f, {0, 1, 2})
    ups = {i: local(W0, i) for i in range(3)}
    w1 = W0 + sum(EXAMPLES[i] * (ups[i] - W0) for i in range(3)) / sum(EXAMPLES[:3])
    sent = round_with(f, {0, 1, 2})
    assert [sent[i]["group"].tolist() for i in range(4)] == [[0], [0], [1], [-1]]
    a2, b2 = fedavg({0: local(w1, 0), 1: local(w1, 1)}), local(w1, 2)
    rule, state = f.strategy.rule, f.strategy.state  # type: ignore[attr-defined]
    np.testing.assert_allclose(rule.evaluated_model(state, 3, f.arrays)[0], w1, atol=1e-6)
    np.testing.assert_allclose(rule.evaluated_model(state, 2, f.arrays)[0], b2, atol=1e-6)
    round_with(f, {0, 1, 2, 3})
    models = {1: a2, 2: b2}
    joins = min((1, 2), key=lambda g: (loss(models[g], 3), g))
    assert joins == 1 and loss(a2, 3) > 0.1 * loss(b2, 3)  # a member would have stayed
    assert f.strategy.state.team[0].tolist() == [1, 1, 2, 1]  # type: ignore[attr-defined]
    a3 = fedavg({i: local(a2, i) for i in (0, 1, 3)})
    np.testing.assert_allclose(server_copies(f, 4), [a3, a3, local(b2, 2), a3], atol=1e-6)


def test_a_client_that_has_not_chosen_is_served_its_nearest_clients_group(
        tmp_path: Path) -> None:
    """Client 3 uploads in the warm-up (round 1) only. After round 2 it is served its seeded
    group's model (group 2: client 2's upload from w_1) while it has no nearest; with the
    state's ``nearest`` naming client 0 (0's data fit its warm-up upload best) it is served
    group 1's model (the FedAvg of 0 and 1); once it has chosen (round 3), its own group's."""
    import dataclasses

    f = by_loss(tmp_path, [(0, 1, 1.0), (2, 3, 1.0)], **{"relax-group-margin": 0.9})
    round_with(f, {0, 1, 2, 3})
    ups = {i: local(W0, i) for i in range(4)}
    w1 = W0 + sum(EXAMPLES[i] * (ups[i] - W0) for i in range(4)) / sum(EXAMPLES)
    round_with(f, {0, 1, 2})
    a2, b2 = fedavg({0: local(w1, 0), 1: local(w1, 1)}), local(w1, 2)
    rule, state = f.strategy.rule, f.strategy.state  # type: ignore[attr-defined]
    np.testing.assert_allclose(rule.evaluated_model(state, 3, f.arrays)[0], b2, atol=1e-6)
    near = np.zeros((4, 2))
    near[3] = (0 + 1, 0.1)
    state = dataclasses.replace(state, nearest=[near])
    np.testing.assert_allclose(rule.evaluated_model(state, 3, f.arrays)[0], a2, atol=1e-6)
    np.testing.assert_allclose(rule.evaluated_model(state, 2, f.arrays)[0], b2, atol=1e-6)
    f.strategy.state = state  # type: ignore[attr-defined]
    round_with(f, {3})  # margin 0.9: it stays in group 2, whose model is now its upload
    state = f.strategy.state  # type: ignore[attr-defined]
    assert state.team[0].tolist() == [1, 1, 2, 2]
    np.testing.assert_allclose(rule.evaluated_model(state, 3, f.arrays)[0], local(b2, 3),
                               atol=1e-6)


def test_a_pooled_client_is_seeded_into_its_nearest_clients_group() -> None:
    """Groups {0, 1} (label 0), {2, 3} (label 2), the pool {4, 5, 6, 7}. 4's model fit client
    3's data best: group 2. 5's fit 6's, pooled too: it stays (no chains). 6 has no nearest:
    stays. 7's fit 0's: group 0. The members keep their groups whatever their nearest."""
    labels = np.asarray([0, 0, 2, 2, gg.POOL, gg.POOL, gg.POOL, gg.POOL], dtype=np.int64)
    nearest = np.asarray([[3, 0.1], [0, 0.0], [1, 0.2], [1, 0.3], [4, 0.5], [7, 0.1],
                          [0, 0.0], [1, 0.4]])
    assert gg.placed(labels, nearest).tolist() == [0, 0, 2, 2, 2, gg.POOL, gg.POOL, 0]
    assert gg.placed(labels, nearest[:5]).tolist() == [0, 0, 2, 2, 2] + [gg.POOL] * 3


def test_joined_is_ifcas_choice_with_the_members_margin() -> None:
    metrics = {gl.loss_key(0): 0.9, gl.loss_key(2): 0.5, gl.loss_key(5): 0.5}
    ids = np.asarray([0, 2, 5])
    assert gg.joined(metrics, ids, 0, 0.0) == 1  # the lowest; a tie: the first
    assert gg.joined(metrics, ids, 2, 0.0) == 2  # a tie with its own group: it stays
    assert gg.joined(metrics, ids, 0, 0.5) == 0  # 0.5 is not below 0.5 x 0.9: stays
    assert gg.joined(metrics, ids, 0, 0.4) == 1  # 0.5 < 0.6 x 0.9
    assert gg.joined(metrics, ids, -1, 0.9) == 1  # a newcomer: the lowest, no margin


def test_groups_by_loss_refusals() -> None:
    base = {"method": "fedrelax", "beta": 0.0, "graph": "loss", "relax-warmup": 3}
    for raw, message in (
            ({"relax-groups-by": "ifca"}, r"relax-groups-by='ifca' is not allowed; allowed: "
                                          r"graph \| loss$"),
            ({"relax-groups-by": "loss"}, r"relax-groups-by='loss' is not allowed; allowed: "
                                          r"graph with relax-train='gtv'"),
            ({"relax-groups-by": "loss", "relax-train": "groups", "relax-warmup": 0},
             r"relax-groups-by='loss' is not allowed; allowed: graph with relax-warmup=0"),
            ({"relax-group-split": 0.1, "relax-train": "groups"},
             r"relax-group-split=0.1 is not allowed; allowed: -1 with relax-groups-by='graph'"),
            ({"relax-group-split": 1.5, "relax-train": "groups", "relax-groups-by": "loss"},
             r"relax-group-split=1.5 is not allowed; allowed: a cosine in \[-1, 1\]"),
            ({"relax-group-margin": 1.0}, r"relax-group-margin=1.0 is not allowed; allowed: "
                                          r"a fraction in \[0, 1\)$")):
        with pytest.raises(ConfigError, match=r"^run config: " + message):
            RunConfig.parse({**base, **raw})
    params = RunConfig.parse(base).params
    assert (params.relax_groups_by, params.relax_group_margin,  # type: ignore[attr-defined]
            params.relax_group_split) == ("graph", 0.1, -1.0)  # type: ignore[attr-defined]


def test_the_report_row_names_the_group_rule() -> None:
    from fedinit.scripts.personal_report import row_label

    base = {"method": "fedrelax", "beta": 0.0, "graph": "loss", "relax-warmup": 10,
            "relax-train": "groups"}
    assert row_label({**base, "relax-groups-by": "loss"}) == (
        "FedRelax (learned graph: loss, warm-up 10, train groups by loss)")
    assert row_label({**base, "relax-groups-by": "loss", "relax-group-margin": 0.0,
                      "relax-group-split": 0.2}) == (
        "FedRelax (learned graph: loss, warm-up 10, train groups by loss, margin 0, split 0.2)")
