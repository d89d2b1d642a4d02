"""Clustered FL through the real server and client code on two synthetic regimes: k-means of
the round-1 updates separates them, each cluster's model reaches its regime's least squares,
and each client is sent its cluster's model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from methods import wire as rk
from methods.clustered import relabel
from methods.packed_arrays import unpack
from task.config import ConfigError, RunConfig
from tests.lsq_problem import Federation, Problem, lsq_optimum
from tests.test_fedrelax import two_regimes


def clustered(p: Problem, **raw: object) -> Federation:
    return Federation(p, {"method": "clustered", "beta": 0.0, "num-clusters": 2,
                          "cluster-every": 100, "lr": 0.05, "local-epochs": 10,
                          "batch-size": 1000, "fraction-train": 1.0, "weighting": "uniform",
                          **raw})


def test_two_regimes_fall_into_two_clusters_each_with_its_least_squares(
        tmp_path: Path) -> None:
    p = two_regimes()
    f = clustered(p)
    f.strategy.bind_run_dir(tmp_path)
    f.run(1)
    assignment = f.strategy.state.assignment[0]  # type: ignore[attr-defined]
    assert len(set(assignment[:4])) == 1 and len(set(assignment[4:])) == 1
    assert assignment[0] != assignment[4]
    lines = [json.loads(x) for x in (tmp_path / "clusters.jsonl").read_text().splitlines()]
    assert lines == [{"round": 1, "assignment": [int(a) for a in assignment]}]
    f.run(29)
    before = f.strategy.state.models[0].copy()  # type: ignore[attr-defined]
    f.step()
    models = f.strategy.state.models[0]  # type: ignore[attr-defined]
    for members in (range(4), range(4, 8)):
        sub = Problem([p.xs[i] for i in members], [p.ys[i] for i in members], p.w0, True,
                      p.loss_fn)
        want = lsq_optimum(sub)  # the regime's pooled least squares (equal sizes, K steps)
        got = models[assignment[members[0]]]
        assert np.abs(got - want).max() < 0.05 * np.abs(want).max(), (got, want)
    for msg in f.sent:  # each client is sent its own cluster's model
        pid = msg.metadata.dst_node_id - 1000
        sent = unpack(msg.content.array_records[rk.ARRAYS])[0]
        np.testing.assert_array_equal(sent, before[assignment[pid]])
    assert (tmp_path / "clusters.jsonl").read_text().count("\n") == 1  # no change, no line


def test_relabel_keeps_labels_and_gives_new_clusters_a_model() -> None:
    """New clusters take the old labels they overlap most; a cluster none of whose members
    was in its label before takes the model most of them come from."""
    renamed, source = relabel(np.asarray([0, 0, 1, 1]), np.asarray([1, 1, 0, 0]), 2)
    assert renamed.tolist() == [0, 0, 1, 1] and source.tolist() == [0, 1]
    renamed, source = relabel(np.asarray([0, 0, 0, 0]), np.asarray([0, 0, 1, 1]), 2)
    assert sorted(set(renamed.tolist())) == [0, 1] and source.tolist() == [0, 0]


def test_clustered_refuses_ri_and_bad_keys() -> None:
    with pytest.raises(ConfigError, match=r"beta=0.1 is not allowed; allowed: 0 with "):
        RunConfig.parse({"method": "clustered"})
    with pytest.raises(ConfigError, match=r"num-clusters=0 is not allowed"):
        RunConfig.parse({"method": "clustered", "beta": 0.0, "num-clusters": 0})
    with pytest.raises(ConfigError, match=r"aggregation='median' is not allowed"):
        RunConfig.parse({"method": "clustered", "beta": 0.0, "aggregation": "median"})
