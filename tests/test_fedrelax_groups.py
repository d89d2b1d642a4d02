"""FedRelax's ``relax-train=groups`` (issue 45 item 3): one model per group of the graph, FedAvg
within the group, through the real server and client code against a numpy computation; the
groups against scipy's connected components; the loss graph's mutual choices; the candidate
models kept apart from the group's; the refusals and the report label."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from fedinit.config import ConfigError, RunConfig
from fedinit.methods import graph_groups as gg
from fedinit.methods import graph_loss as gl
from fedinit.methods.fedrelax import OWN
from testbeds.lsq_problem import Federation, Problem, half_sq_norm
from tests.test_fedrelax import own_models, regression, write_graph
from tests.test_fedrelax_server_step import server_copies, step_with

TARGETS = np.asarray([[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0], [3.0, 1.0]])
"""f_i(w) = 0.5 ||w - a_i||^2 per example."""
EXAMPLES = [3, 1, 1, 2]
"""Client i holds its target this many times: 3 (2) steps for client 0 (3), FedAvg weights."""
W0 = np.asarray([0.5, 0.5])
LR = 0.1


def problem() -> Problem:
    xs = [torch.tensor(np.repeat(a[None], m, axis=0), dtype=torch.float32)
          for a, m in zip(TARGETS, EXAMPLES, strict=True)]
    ys = [torch.zeros(m) for m in EXAMPLES]
    return Problem(xs, ys, W0.astype(np.float32), False, half_sq_norm)


def local(start: np.ndarray, cid: int) -> np.ndarray:
    """Client cid's SGD from ``start``: one step of lr 0.1 per example, batch 1 (alpha 0)."""
    w = start.copy()
    for _ in range(EXAMPLES[cid]):
        w = w - LR * (w - TARGETS[cid])
    return w


def fedavg(uploads: dict[int, np.ndarray]) -> np.ndarray:
    mass = sum(EXAMPLES[i] for i in uploads)
    return sum(EXAMPLES[i] * w for i, w in uploads.items()) / mass


def grouped(tmp_path: Path, **raw: object) -> Federation:
    return Federation(problem(), {
        "method": "fedrelax", "beta": 0.0, "fedrelax-alpha": 0.0, "lr": LR,
        "graph": write_graph(tmp_path, [(0, 1, 1.0), (2, 3, 1.0)]), "local-epochs": 1,
        "batch-size": 1, "fraction-train": 1.0, "weighting": "examples",
        "relax-train": "groups", **raw})


def test_two_groups_of_two_by_fedavg_within_each(tmp_path: Path) -> None:
    """Groups {0, 1} and {2, 3}. Round 1, all train from w_0 = (0.5, 0.5): each group's model
    becomes the example-weighted mean of its members' uploads, held by every member. Round 2,
    only client 0 replies: it trained from its group's model (sent as its start), and its
    upload (weight 3 of 3) replaces the model of group {0, 1}, client 1 included; group
    {2, 3} keeps its model. The global model is the mean of the four copies."""
    f = grouped(tmp_path)
    sent = step_with(f, {0, 1, 2, 3})
    up1 = {i: local(W0, i) for i in range(4)}
    a1, b1 = fedavg({0: up1[0], 1: up1[1]}), fedavg({2: up1[2], 3: up1[3]})
    for i in range(4):
        np.testing.assert_allclose(sent[i]["start"], W0, atol=1e-7)
    np.testing.assert_allclose(server_copies(f, 4), [a1, a1, b1, b1], atol=1e-6)
    np.testing.assert_allclose(f.weights, (2 * a1 + 2 * b1) / 4, atol=1e-6)

    sent = step_with(f, {0})
    np.testing.assert_allclose(sent[0]["start"], a1, atol=1e-6)
    np.testing.assert_allclose(sent[2]["start"], b1, atol=1e-6)
    a2 = local(a1, 0)
    np.testing.assert_allclose(server_copies(f, 4), [a2, a2, b1, b1], atol=1e-6)
    np.testing.assert_allclose(f.weights, (2 * a2 + 2 * b1) / 4, atol=1e-6)
    # every member is served its group's model; client 1 holds its round-1 model itself
    rule, state = f.strategy.rule, f.strategy.state  # type: ignore[attr-defined]
    for i, want in enumerate([a2, a2, b1, b1]):
        np.testing.assert_allclose(rule.evaluated_model(state, i, f.arrays)[0], want, atol=1e-6)
    np.testing.assert_allclose(f.state_of(1, OWN)[0], up1[1], atol=1e-6)


def test_merged_groups_start_from_the_mean_of_their_copies(tmp_path: Path) -> None:
    """A client that joins a group after its members trained apart (here: groups read from the
    state's graph, changed by hand) starts from the plain mean of the members' copies."""
    f = grouped(tmp_path)
    step_with(f, {0, 1, 2, 3})
    up1 = {i: local(W0, i) for i in range(4)}
    a1, b1 = fedavg({0: up1[0], 1: up1[1]}), fedavg({2: up1[2], 3: up1[3]})
    rule, state = f.strategy.rule, f.strategy.state  # type: ignore[attr-defined]
    joined = [np.asarray([[0, 1], [1, 2], [2, 3]], dtype=np.int64), np.ones(3)]
    import dataclasses
    f.strategy.state = dataclasses.replace(state, graph=joined)  # type: ignore[attr-defined]
    sent = step_with(f, set())
    np.testing.assert_allclose(sent[3]["start"], (2 * a1 + 2 * b1) / 4, atol=1e-6)
    assert rule.groups(f.strategy.state, 4).tolist() == [0, 0, 0, 0]  # type: ignore[attr-defined]


def test_singletons_train_as_gtvmin_alone(tmp_path: Path) -> None:
    """On a graph without an edge every group is one client: ``groups`` stores each upload as
    that client's model, as ``gtv`` does: the same client models, server copies and global
    model (float64 sums in another order: equal to 1e-12)."""
    p = regression(5)
    empty = tmp_path / "empty.txt"
    empty.write_text("# no edges\n")
    raw = {"method": "fedrelax", "beta": 0.0, "fedrelax-alpha": 0.3, "graph": f"file:{empty}",
           "lr": 0.2, "local-epochs": 2, "batch-size": 8, "fraction-train": 0.6}
    on = Federation(p, {**raw, "relax-train": "groups"})
    off = Federation(p, raw)
    np.testing.assert_allclose(on.run(4), off.run(4), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(own_models(on), own_models(off))
    np.testing.assert_array_equal(server_copies(on, 5), server_copies(off, 5))


def random_chosen(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """Up to k choices per client, each from its own block of 5 with probability 0.8 (so
    some are mutual), else from anyone."""
    chosen = np.full((n, k), gl.NONE, dtype=np.int64)
    for i in range(n):
        block = [j for j in range(5 * (i // 5), min(5 * (i // 5) + 5, n)) if j != i]
        picks = {int(rng.choice(block if rng.random() < 0.8 else range(n)))
                 for _ in range(rng.integers(0, k + 1))} - {i}
        chosen[i, :len(picks)] = sorted(picks)
    return chosen


@pytest.mark.parametrize("seed", range(5))
def test_groups_are_scipys_components_of_the_mutual_choices(seed: int) -> None:
    """Mutual pairs by a dense check of both directions; components by scipy (labels mapped to
    each component's smallest client)."""
    rng = np.random.default_rng(seed)
    n, k = 25, 3
    chosen = random_chosen(rng, n, k)
    picks = np.zeros((n, n), dtype=bool)
    for i, row in enumerate(chosen):
        picks[i, row[row != gl.NONE]] = True
    both = picks & picks.T
    mutual = gg.mutual_graph(chosen)
    want = sorted((i, j) for i in range(n) for j in range(i + 1, n) if both[i, j])
    assert [tuple(e) for e in mutual[0].tolist()] == want
    count, comp = connected_components(coo_matrix(both.astype(np.int8)), directed=False)
    smallest = {c: int(np.flatnonzero(comp == c).min()) for c in range(count)}
    assert gg.components(mutual, n).tolist() == [smallest[c] for c in comp]
    assert count < n  # the check is not all singletons
    assert 0 < len(want) < int(picks.sum())  # and not every choice mutual


def test_a_one_way_choice_joins_no_component() -> None:
    """0 and 1 choose each other, 2 chose 1 but 1 did not choose 2: {0, 1} and {2}."""
    chosen = np.asarray([[1, gl.NONE], [0, gl.NONE], [1, gl.NONE]], dtype=np.int64)
    assert gg.components(gg.mutual_graph(chosen), 3).tolist() == [0, 0, 2]
    assert gg.members(np.asarray([0, 0, 2]), 1).tolist() == [0, 1]
    assert gg.members(np.asarray([0, 0, 2]), 5).tolist() == [5]


def test_a_client_in_no_pair_joins_the_group_most_of_its_choices_are_in() -> None:
    """Cores {0, 1} and {2, 3} (mutual). 4 chose 0, 2, 3: group 2 (two votes to one). 5 chose
    1 and 2: a tie, the smaller group id 0. 6 chose only 4, itself attached (no chains): alone.
    7 chose nothing: alone. A core member keeps its group whatever it chose."""
    x = gl.NONE
    chosen = np.asarray([[1, 6, x], [0, x, x], [3, x, x], [2, 5, 0], [0, 2, 3], [1, 2, x],
                         [4, x, x], [x, x, x]], dtype=np.int64)
    core = gg.components(gg.mutual_graph(chosen), 8)
    assert core.tolist() == [0, 0, 2, 2, 4, 5, 6, 7]
    assert gg.attached(core, chosen).tolist() == [0, 0, 2, 2, 2, 0, 6, 7]
    # the clients still alone (6, 7) form one group, the pool
    assert gg.pooled(gg.attached(core, chosen)).tolist() == [0, 0, 2, 2, 2, 0, gg.POOL, gg.POOL]


def test_the_loss_graph_scores_uploads_not_the_group_model(tmp_path: Path) -> None:
    """Under ``graph=loss`` with a warm-up, members share one server copy (the group's model)
    while each client's candidate model is its own last upload (what the client itself holds
    as w^(i)); the groups are the components of the mutual choices in the state."""
    f = Federation(problem(), {
        "method": "fedrelax", "beta": 0.0, "fedrelax-alpha": 0.0, "lr": LR, "graph": "loss",
        "graph-k": 1, "relax-warmup": 1, "local-epochs": 1, "batch-size": 1,
        "fraction-train": 1.0, "relax-train": "groups"})
    f.run(4)
    rule, state = f.strategy.rule, f.strategy.state  # type: ignore[attr-defined]
    labels = gg.pooled(gg.attached(gg.components(gg.mutual_graph(state.chosen[0]), 4),
                                   state.chosen[0]))
    assert rule.groups(state, 4).tolist() == labels.tolist()
    assert len(set(labels.tolist())) < 4  # some group holds two clients
    copies = server_copies(f, 4)
    for i in range(4):
        np.testing.assert_array_equal(rule.candidate_model(state, i)[0], f.state_of(i, OWN)[0])
        for j in np.flatnonzero(labels == labels[i]):
            np.testing.assert_array_equal(copies[i], copies[j])
    grouped_ids = [i for i in range(4) if np.count_nonzero(labels == labels[i]) > 1]
    assert any(not np.array_equal(copies[i], f.state_of(i, OWN)[0]) for i in grouped_ids)


def test_relax_train_refusals() -> None:
    with pytest.raises(ConfigError, match=r"^run config: relax-train='cluster' is not "
                                          r"allowed; allowed: gtv \| groups$"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "relax-train": "cluster"})
    with pytest.raises(ConfigError, match=r"^run config: relax-server-step=0.5 is not allowed; "
                                          r"allowed: 0 with relax-train='groups'"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "relax-train": "groups",
                         "relax-server-step": 0.5})
    with pytest.raises(ConfigError, match=r"relax-train='groups' is not allowed; allowed: "
                                          r"gtv with method='fedrelax' with rounds='async'"):
        RunConfig.parse({"method": "fedrelax", "beta": 0.0, "relax-train": "groups",
                         "rounds": "async", "graph": "file:/tmp/g.txt"})
    assert RunConfig.parse({"method": "fedrelax", "beta": 0.0}).params.relax_train == "gtv"


def test_the_report_row_names_the_graph_settings_and_the_training() -> None:
    from fedinit.scripts.personal_report import row_label

    base = {"method": "fedrelax", "beta": 0.0, "graph": "loss", "relax-warmup": 10}
    assert row_label({**base, "graph-k": 3, "graph-refresh-every": 5}) == (
        "FedRelax (learned graph: loss, warm-up 10)")
    assert row_label({**base, "graph-k": 6, "graph-refresh-every": 2,
                      "relax-train": "groups"}) == (
        "FedRelax (learned graph: loss, k 6, refresh every 2, warm-up 10, train groups)")
    assert row_label({**base, "graph": "file:/g.txt", "graph-k": 6}) == (
        "FedRelax (given graph, warm-up 10)")


def test_groups_measure_during_the_warm_up(tmp_path: Path) -> None:
    """Under ``groups`` with ``graph=loss`` the warm-up's messages carry the candidates due
    (round 2 on: the warm-up uploads so far), so every client has a choice when the group
    training starts; under ``gtv`` the warm-up measures nothing (today's rule)."""
    raw = {"method": "fedrelax", "beta": 0.0, "fedrelax-alpha": 0.0, "lr": LR,
           "graph": "loss", "graph-k": 1, "relax-warmup": 2, "local-epochs": 1,
           "batch-size": 1, "fraction-train": 1.0}
    for train, measures in (("groups", True), ("gtv", False)):
        f = Federation(problem(), {**raw, "relax-train": train})
        f.run(2)
        state = f.strategy.state  # type: ignore[attr-defined]
        chosen = state.chosen[0]
        if measures:
            assert state.measured[0].tolist() == [2, 2, 2, 2]
            # each client chose the candidate whose warm-up upload fits its target best
            ups = {i: local(W0, i) for i in range(4)}
            for i in range(4):
                loss = {j: 0.5 * float(np.sum((ups[j] - TARGETS[i]) ** 2))
                        for j in range(4) if j != i}
                assert chosen[i, 0] == min(loss, key=lambda j: (loss[j], j))
        else:
            assert len(chosen) == 0 or (chosen == gl.NONE).all()
