"""The local test split: disjoint from training data, stratified, seeded, and the same in any
process (a simulation worker, a SuperNode, the server checking example counts)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest

from fedinit.config import ConfigError, RunConfig
from fedinit.task.federated_data import (
    client_examples,
    client_indices,
    client_test_examples,
    local_test_indices,
    partition_indices,
    partition_sizes,
)
from fedinit.task.local_split import local_test_positions, split_positions

RUN = {"num-clients": 5, "train-limit": 2000, "dirichlet-alpha": 0.3, "seed": 4}


def test_split_is_disjoint_complete_and_stratified() -> None:
    labels = np.repeat([0, 1, 2, 3], [50, 23, 7, 1])
    train, test = split_positions(labels, 0.2, seed=1, partition_id=3)
    assert np.intersect1d(train, test).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(81))
    assert test.size == round(0.2 * 81)
    for cls, count in zip(*np.unique(labels, return_counts=True), strict=True):
        assert abs(np.sum(labels[test] == cls) - 0.2 * count) < 1.0, cls
    assert np.sum(labels[test] == 0) == 10  # 50 * 0.2 exactly


def test_split_is_seeded() -> None:
    labels = np.random.default_rng(0).integers(0, 10, size=300)
    a = local_test_positions(labels, 0.2, seed=1, partition_id=3)
    np.testing.assert_array_equal(a, local_test_positions(labels, 0.2, seed=1, partition_id=3))
    assert not np.array_equal(a, local_test_positions(labels, 0.2, seed=2, partition_id=3))
    assert not np.array_equal(a, local_test_positions(labels, 0.2, seed=1, partition_id=4))


def test_fraction_zero_and_tiny_clients_have_no_test_split() -> None:
    assert local_test_positions(np.arange(40) % 3, 0.0, 0, 0).size == 0
    assert local_test_positions(np.array([5]), 0.5, 0, 0).size == 0  # keeps its one example
    assert local_test_positions(np.array([5, 5]), 0.5, 0, 0).size == 1


def test_clients_train_on_their_partition_less_the_test_split() -> None:
    cfg = RunConfig.parse(RUN)
    for cid in range(cfg.num_clients):
        train, test, whole = (client_indices(cfg, cid), local_test_indices(cfg, cid),
                              partition_indices(cfg, cid))
        assert np.intersect1d(train, test).size == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), whole)
        assert test.size == round(0.2 * whole.size)
        assert client_examples(cfg, cid)[1].size == train.size
        assert client_test_examples(cfg, cid)[1].size == test.size
    # the server's expected example counts (to reject false claims) follow the train split
    assert partition_sizes(cfg) == tuple(len(client_indices(cfg, p)) for p in range(5))
    off = RunConfig.parse({**RUN, "local-test-fraction": 0.0, "personal-eval-every": 0})
    assert partition_sizes(off) == tuple(len(partition_indices(off, p)) for p in range(5))
    assert sum(partition_sizes(off)) == 2000 > sum(partition_sizes(cfg))


@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.25, 0.5, 0.9])
def test_expected_counts_equal_the_drawn_splits_with_tiny_clients(fraction: float) -> None:
    """The server counts each client's training examples without drawing its split; with
    60 clients on 90 examples (Dirichlet 0.1: many hold 1 or 2) the counts must still
    be exactly the sizes the clients draw."""
    cfg = RunConfig.parse({"num-clients": 60, "train-limit": 90, "dirichlet-alpha": 0.1,
                           "seed": 2, "local-test-fraction": fraction,
                           "personal-eval-every": 0 if fraction == 0 else 20})
    sizes = [len(partition_indices(cfg, p)) for p in range(60)]
    assert min(sizes) == 1 and max(sizes) >= 3
    assert partition_sizes(cfg) == tuple(len(client_indices(cfg, p)) for p in range(60))


def test_another_process_computes_the_same_split(another_process: dict[str, Any]) -> None:
    cfg = RunConfig.parse(RUN)
    mine = hashlib.sha256(b"".join(local_test_indices(cfg, p).tobytes()
                                   for p in range(5))).hexdigest()
    assert another_process["split"] == mine


@pytest.mark.parametrize("value", [-0.1, 1.0])
def test_bad_fraction_is_refused_in_one_line(value: float) -> None:
    with pytest.raises(ConfigError, match="local-test-fraction"):
        RunConfig.parse({"local-test-fraction": value})
