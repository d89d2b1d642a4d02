"""``aggregation=median|trimmed-mean`` against an independent numpy computation.

Both are coordinate-wise and ignore the example weights (``fedinit/methods/robust.py``): a client
cannot buy influence by claiming more examples. The trimmed mean drops floor(trim * n)
values at EACH end of every coordinate (the float product, as Flower's and scipy's
``trim_mean`` do). The reference below sorts each coordinate in plain Python; the first
group calls ``robust.combine`` (the one entry the server uses), the second drives a method's
server half through Flower's Strategy API, so they survive a refactor of the internals.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.robust import combine
from fedinit.methods.weights import Weights
from strategies.method_strategy import MethodStrategy

SHAPES = [(3, 2), (4,)]


# ---------------------------------------------------------------- independent reference
def ref_median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def ref_trimmed(values: list[float], trim: float) -> float:
    k = math.floor(trim * len(values))
    kept = sorted(values)[k:len(values) - k]
    return sum(kept) / len(kept)


def by_coordinate(vectors: list[Weights], stat: Any) -> Weights:
    """Apply ``stat`` (list of floats -> float) to each coordinate across the vectors."""
    out = []
    for i, shape in enumerate(SHAPES):
        flat = [np.asarray(v[i], dtype=np.float64).ravel() for v in vectors]
        out.append(np.array([stat([float(f[j]) for f in flat]) for j in range(flat[0].size)])
                   .reshape(shape))
    return out


def random_vectors(n: int, seed: int, ties: bool = False) -> list[Weights]:
    """n model-shaped float32 vectors; ``ties`` draws from few integers (many equal values)."""
    rng = np.random.default_rng(seed)
    draw = ((lambda s: rng.integers(-2, 3, size=s).astype(np.float32)) if ties
            else (lambda s: rng.standard_normal(s).astype(np.float32)))
    return [[draw(shape) for shape in SHAPES] for _ in range(n)]


def assert_weights(got: Weights, want: Weights) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == np.float32 and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def vec(*columns: float) -> Weights:
    """A model-shaped vector whose every coordinate is the same value per array."""
    return [np.full(SHAPES[0], columns[0], np.float32), np.full(SHAPES[1], columns[1], np.float32)]


# ---------------------------------------------------------------- robust.combine
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("ties", [False, True])
def test_median_is_the_coordinate_wise_median(n: int, ties: bool) -> None:
    """Guards odd counts (middle value), even counts (mean of the two middle values, as
    np.median) and ties, coordinate by coordinate over every array of the model."""
    vectors = random_vectors(n, seed=n, ties=ties)
    weights = [1.0 + i for i in range(n)]
    assert_weights(combine(vectors, weights, "median", 0.1), by_coordinate(vectors, ref_median))


@pytest.mark.parametrize(("n", "trim", "k"), [
    (5, 0.0, 0), (5, 0.19, 0), (5, 0.2, 1), (5, 0.39, 1), (5, 0.4, 2), (4, 0.25, 1),
    (4, 0.24, 0), (10, 0.3, 3), (10, 0.25, 2), (2, 0.49, 0), (3, 0.34, 1), (7, 0.49, 3),
])
@pytest.mark.parametrize("ties", [False, True])
def test_trimmed_mean_drops_floor_trim_n_at_each_end(n: int, trim: float, k: int,
                                                      ties: bool) -> None:
    """Guards the cut count k = floor(trim * n) (not rounded, not ceiled), at both ends,
    per coordinate, with ties (equal values at the cut are dropped by count, not by value)."""
    assert math.floor(trim * n) == k  # the table's own arithmetic
    vectors = random_vectors(n, seed=10 * n + k, ties=ties)
    want = by_coordinate(vectors, lambda v: ref_trimmed(v, trim))
    assert_weights(combine(vectors, [1.0] * n, "trimmed-mean", trim), want)


def test_trimmed_mean_cuts_ties_by_count_and_each_coordinate_on_its_own() -> None:
    """By hand: column 0 is (1, 1, 2, 9, 9): k = 1 keeps (1, 2, 9), mean 4 (dropping every
    value equal to the extremes would give 2); column 1 has a different client at each end."""
    vectors = [vec(1, 5), vec(1, -7), vec(2, 0), vec(9, 1), vec(9, 3)]
    got = combine(vectors, [1.0] * 5, "trimmed-mean", 0.2)
    # column 1 sorted: (-7, 0, 1, 3, 5) -> (0, 1, 3): 4/3
    assert_weights(got, vec(4.0, 4.0 / 3.0))


def test_median_by_hand() -> None:
    """Odd: (1, 1, 2, 9, 9) -> 2; even: (1, 1, 2, 9) -> 1.5."""
    five = [vec(1, 5), vec(1, -7), vec(2, 0), vec(9, 1), vec(9, 3)]
    assert_weights(combine(five, [1.0] * 5, "median", 0.0), vec(2.0, 1.0))
    assert_weights(combine(five[:4], [1.0] * 4, "median", 0.0), vec(1.5, 0.5))


@pytest.mark.parametrize("kind", ["median", "trimmed-mean"])
def test_robust_statistics_ignore_the_weights(kind: str) -> None:
    """Guards the documented choice: a reply claiming 1e6 examples has no more say."""
    vectors = random_vectors(5, seed=3)
    even = combine(vectors, [1.0] * 5, kind, 0.2)
    skewed = combine(vectors, [1e6, 1.0, 1.0, 1.0, 1.0], kind, 0.2)
    for a, b in zip(even, skewed, strict=True):
        assert a.tobytes() == b.tobytes()


def test_mean_is_the_weighted_mean() -> None:
    """The default ``mean`` does use the weights (example counts): np.average."""
    vectors = random_vectors(4, seed=4)
    weights = [1.0, 2.0, 3.0, 10.0]
    want = [np.average(np.stack([v[i].astype(np.float64) for v in vectors]), axis=0,
                       weights=weights) for i in range(len(SHAPES))]
    assert_weights(combine(vectors, weights, "mean", 0.0), want)


def test_trim_zero_is_the_unweighted_mean() -> None:
    vectors = random_vectors(5, seed=5)
    want = [np.mean(np.stack([v[i].astype(np.float64) for v in vectors]), axis=0)
            for i in range(len(SHAPES))]
    assert_weights(combine(vectors, [9.0, 1.0, 1.0, 1.0, 1.0], "trimmed-mean", 0.0), want)


# ---------------------------------------------------------------- through the strategy
RNG = np.random.default_rng(11)
W_T: Weights = [RNG.standard_normal(s).astype(np.float32) for s in SHAPES]
SIZES = [10, 20, 30, 40, 1000]


def server(aggregation: str, variant: str, trim: float = 0.2) -> MethodStrategy:
    """FedAvg's server half, five clients all sampled, the norm filter off."""
    set_task_identity()
    cfg = RunConfig.parse({"method": "fedavg", "num-clients": 5, "fraction-train": 1.0,
                           "beta": 0.0, "ri-aggregation": variant, "aggregation": aggregation,
                           "trim-fraction": trim, "max-update-norm-ratio": 0.0,
                           "output-dir": "/tmp/unused"})
    s = MethodStrategy(cfg, {p: 1000 + p for p in range(5)}, W_T, examples=SIZES)
    return s


def round_with(s: MethodStrategy, moves: list[Weights], variant: str) -> Weights:
    """One round in which client i's final model is w_t + moves[i]; the new global model."""
    msgs = list(s.configure_train(1, ArrayRecord(W_T), ConfigRecord(), cast(Grid, None)))
    replies = []
    for msg in msgs:
        i = msg.metadata.dst_node_id - 1000
        up = moves[i] if variant == "update" else [
            (w + d).astype(np.float32) for w, d in zip(W_T, moves[i], strict=True)]
        content = RecordDict({rk.ARRAYS: ArrayRecord(up), rk.METRICS: MetricRecord(
            {rk.NUM_EXAMPLES: SIZES[i], rk.TRAIN_LOSS: 0.1, rk.NUM_STEPS: 1}),
            rk.CONFIG: ConfigRecord({rk.UPLOAD_DELTA: variant == "update"})})
        replies.append(Message(content=content, reply_to=msg))
    arrays, metrics = s.aggregate_train(1, replies)
    assert arrays is not None and metrics is not None and metrics["num-rejected"] == 0
    return unpack(arrays)


@pytest.mark.parametrize("variant", ["model", "update"])
@pytest.mark.parametrize("aggregation", ["median", "trimmed-mean"])
def test_the_server_applies_the_robust_statistic_of_the_moves(aggregation: str,
                                                              variant: str) -> None:
    """Guards the wiring ``aggregation`` -> the server's mean: w_next = w_t + stat(moves),
    unweighted although client 4 claims 1000 examples and moved 1e3 x further."""
    moves = random_vectors(5, seed=6)
    moves[4] = [(1e3 * a).astype(np.float32) for a in moves[4]]
    stat = ref_median if aggregation == "median" else (lambda v: ref_trimmed(v, 0.2))
    # under ``model`` the statistic is taken over w_t + move: the same up to float32 rounding
    want = [w + d for w, d in zip(W_T, by_coordinate(moves, stat), strict=True)]
    got = round_with(server(aggregation, variant), moves, variant)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    assert max(float(np.abs(a).max()) for a in got) < 10.0  # the outlier did not get in
