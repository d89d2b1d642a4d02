"""The server's norm filter, with hand-made replies whose upload norms are chosen exactly.

Rule (docs/algorithms.md, "Reply checks"): a reply is dropped when any uploaded vector's norm
exceeds ``max-update-norm-ratio`` (r = 20) x the median of this round's norms and the last
NORM_HISTORY accepted norms of that vector; with no history and fewer than MIN_ROUND_NORMS
replies the bound is FIRST_ROUND_FACTOR x ||w_t|| for the model move, and for SCAFFOLD's
Delta_c ||c|| + that bound / eta_t. Everything is driven through Flower's Strategy API
(``configure_train`` / ``aggregate_train``); which replies were dropped is read from the
round's metrics and from the new global model (uniform weights: w_t + mean of kept moves).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.scaffold import DELTA_C
from fedinit.methods.weights import Weights
from strategies.method_strategy import NORM_HISTORY, MethodStrategy

RATIO = 20.0
"""The default ``max-update-norm-ratio``; the tests set it explicitly."""
SHAPES = [(3, 2), (4,)]
EXAMPLES = 10


def unit(seed: int) -> Weights:
    """A model-shaped float32 vector of norm 1 spread over both arrays."""
    rng = np.random.default_rng(seed)
    parts = [rng.standard_normal(s) for s in SHAPES]
    total = np.sqrt(sum(float(np.sum(p**2)) for p in parts))
    return [(p / total).astype(np.float32) for p in parts]


U = unit(1)
"""Every move points along U, so a move of norm r is r * U and a mean of moves is mean(r) U."""


def model(norm: float) -> Weights:
    """A global model w_t with ||w_t|| = norm (another direction than U)."""
    return [(norm * a).astype(np.float32) for a in unit(2)]


def server(method: str = "fedavg", n: int = 4, variant: str = "model",
           **raw: Any) -> MethodStrategy:
    """Every client sampled each round, uniform weights, the filter at ratio 20."""
    set_task_identity()
    cfg = RunConfig.parse({"method": method, "num-clients": n, "fraction-train": 1.0,
                           "beta": 0.0, "ri-aggregation": variant, "weighting": "uniform",
                           "max-update-norm-ratio": RATIO, "output-dir": "/tmp/unused", **raw})
    s = MethodStrategy(cfg, {p: 1000 + p for p in range(n)}, model(1.0),
                       examples=[EXAMPLES] * n)
    return s


def play(s: MethodStrategy, rnd: int, norms: list[float], w_t: Weights,
         delta_c: list[float] | None = None) -> tuple[Weights | None, dict[str, Any]]:
    """Round ``rnd``: the first len(norms) sampled clients move by norms[i] * U (the others
    stay silent); with ``delta_c`` they also upload Delta_c = delta_c[i] * U (SCAFFOLD)."""
    msgs = list(s.configure_train(rnd, ArrayRecord(w_t), ConfigRecord(), cast(Grid, None)))
    replies = []
    for i, norm in enumerate(norms):
        move = [(norm * u).astype(np.float32) for u in U]
        up = move if s.cfg.train.ri_aggregation == "update" else [
            (w + d).astype(np.float32) for w, d in zip(w_t, move, strict=True)]
        extra = {} if delta_c is None else {
            DELTA_C: ArrayRecord([(delta_c[i] * u).astype(np.float32) for u in U])}
        content = RecordDict({rk.ARRAYS: ArrayRecord(up), **extra, rk.METRICS: MetricRecord(
            {rk.NUM_EXAMPLES: EXAMPLES, rk.TRAIN_LOSS: 0.1, rk.NUM_STEPS: 1}),
            rk.CONFIG: ConfigRecord({rk.UPLOAD_DELTA: s.cfg.train.ri_aggregation == "update"})})
        replies.append(Message(content=content, reply_to=msgs[i]))
    arrays, metrics = s.aggregate_train(rnd, replies)
    assert metrics is not None
    return (None if arrays is None else unpack(arrays)), dict(metrics)


def assert_kept(s: MethodStrategy, rnd: int, norms: list[float], kept: list[float],
                w_t: Weights, **kw: Any) -> dict[str, Any]:
    """Play the round and check that exactly the replies moving by ``kept`` got in."""
    got, metrics = play(s, rnd, norms, w_t, **kw)
    assert metrics["num-rejected"] == len(norms) - len(kept), (norms, kept, metrics)
    if not kept:
        assert got is None
        return metrics
    assert got is not None
    want = [w + float(np.mean(kept)) * u for w, u in zip(w_t, U, strict=True)]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-4)
    return metrics


# ---------------------------------------------------------------- one round, no history
@pytest.mark.parametrize("w_norm", [2.0, 100.0])
def test_limit_is_ratio_times_the_median_of_the_round(w_norm: float) -> None:
    """Guards limit = 20 x median (not mean: the mean of 1, 1, 1, 20.5 would admit 20.5),
    strictly-above rejects, and the move measured as ||w_iK - w_t|| (not ||w_iK||, which is
    about ||w_t|| = 100 for every reply and would hide the outlier)."""
    w_t = model(w_norm)
    metrics = assert_kept(server(), 1, [1.0, 1.0, 1.0, 19.5], [1.0, 1.0, 1.0, 19.5], w_t)
    assert metrics["norm-limit-used"] == pytest.approx(19.5 / RATIO, rel=1e-4)
    metrics = assert_kept(server(), 1, [1.0, 1.0, 1.0, 20.5], [1.0, 1.0, 1.0], w_t)
    assert metrics["norm-limit-used"] == pytest.approx(20.5 / RATIO, rel=1e-4)  # rejected too


def test_update_variant_measures_the_uploaded_update() -> None:
    """Under ``ri-aggregation=update`` the upload is Delta_i itself: its norm is judged."""
    w_t = model(100.0)
    assert_kept(server(variant="update"), 1, [1.0, 1.0, 1.0, 20.5], [1.0, 1.0, 1.0], w_t)
    assert_kept(server(variant="update"), 1, [1.0, 1.0, 1.0, 19.5], [1.0, 1.0, 1.0, 19.5], w_t)


def test_min_round_norms_replies_make_a_reference_of_their_own() -> None:
    """With MIN_ROUND_NORMS = 3 replies the median rule applies, although the first-round bound
    (5 x 100 = 500) would admit the outlier; one reply cannot set its own bar."""
    assert_kept(server(), 1, [1.0, 1.0, 25.0], [1.0, 1.0], model(100.0))


@pytest.mark.parametrize(("w_norm", "norms", "kept"), [
    (2.0, [9.9], [9.9]),
    (2.0, [10.1], []),
    (100.0, [1.0, 499.0], [1.0, 499.0]),
    (100.0, [1.0, 600.0], [1.0]),  # the median rule would admit 600 (limit 20 x 300.5)
    (0.0, [1e3], [1e3]),  # w_0 = 0: no scale to bound by, nothing is dropped
])
def test_fewer_replies_than_min_round_norms_use_the_first_round_bound(
        w_norm: float, norms: list[float], kept: list[float]) -> None:
    """Guards the fallback FIRST_ROUND_FACTOR x ||w_t|| (5 x) below MIN_ROUND_NORMS (3)
    replies and without history."""
    assert_kept(server(), 1, norms, kept, model(w_norm))


def test_ratio_zero_turns_the_filter_off() -> None:
    s = server(**{"max-update-norm-ratio": 0.0})
    metrics = assert_kept(s, 1, [1.0, 1.0, 1.0, 1e4], [1.0, 1.0, 1.0, 1e4], model(1.0))
    assert metrics["norm-limit-used"] == 0.0


# ---------------------------------------------------------------- history across rounds
@pytest.mark.parametrize(("lone", "kept"), [(19.0, [19.0]), (21.0, [])])
def test_the_history_sets_the_bar_for_a_lone_reply(lone: float, kept: list[float]) -> None:
    """Round 1 accepts norms 1, 1, 1; in round 2 a lone reply is judged by 20 x median(lone,
    1, 1, 1) = 20, not by the first-round bound 5 x ||w_t|| = 500."""
    s, w_t = server(), model(100.0)
    assert_kept(s, 1, [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], w_t)
    assert_kept(s, 2, [lone], kept, w_t)


def test_rejected_norms_never_enter_the_history() -> None:
    """An attacker repeating a rejected norm cannot raise the bar: if rejected norms were
    remembered, the fourth 30 would meet median(1, 1, 1, 30, 30, 30, 30) -> accepted."""
    s, w_t = server(), model(100.0)
    assert_kept(s, 1, [1.0, 1.0, 1.0], [1.0, 1.0, 1.0], w_t)
    for rnd in range(2, 8):
        assert_kept(s, rnd, [30.0], [], w_t)
    assert_kept(s, 8, [1.0, 1.0], [1.0, 1.0], w_t)  # honest replies still get in


def test_the_history_keeps_the_last_norm_history_accepted_norms() -> None:
    """H = NORM_HISTORY. Round A accepts H norms of 1, round B H/2 norms of 10. Round C
    (H/2 - 1 tens and one 150): with the last H accepted (H/2 ones, H/2 tens) the median of
    C's and the history's norms is 10 and 150 < 200 gets in; with the whole history (H ones)
    it would be 5.5 and 150 > 110 would be dropped; with the oldest kept, likewise."""
    h = NORM_HISTORY
    assert h % 2 == 0
    s, w_t = server(n=h), model(100.0)
    assert_kept(s, 1, [1.0] * h, [1.0] * h, w_t)
    assert_kept(s, 2, [10.0] * (h // 2), [10.0] * (h // 2), w_t)
    history = s.server_state()["norms:" + rk.ARRAYS][0]  # the checkpointed history
    np.testing.assert_allclose(history, [1.0] * (h // 2) + [10.0] * (h // 2), rtol=1e-5)
    round_c = [10.0] * (h // 2 - 1) + [150.0]
    assert_kept(s, 3, round_c, round_c, w_t)


# ---------------------------------------------------------------- SCAFFOLD's Delta_c
def scaffold(**raw: Any) -> MethodStrategy:
    return server("scaffold", n=3, **raw)


def test_each_uploaded_vector_has_its_own_history() -> None:
    """Round 1: moves of 1, Delta_c of 100. A lone reply later is judged per vector: its
    Delta_c against 20 x 100, its move against 20 x 1 (one shared history would mix them)."""
    w_t = model(100.0)
    for lone_move, lone_dc, kept in [(1.0, 1500.0, [1.0]), (1.0, 2500.0, []),
                                     (25.0, 100.0, []), (19.0, 100.0, [19.0])]:
        s = scaffold()
        assert_kept(s, 1, [1.0] * 3, [1.0] * 3, w_t, delta_c=[100.0] * 3)
        assert_kept(s, 2, [lone_move], kept, w_t, delta_c=[lone_dc])


@pytest.mark.parametrize(("c_norm", "move", "dc", "kept"), [
    (0.0, 1.0, 790.0, True),
    (0.0, 1.0, 810.0, False),
    (50.0, 1.0, 840.0, True),
    (50.0, 1.0, 860.0, False),
    (0.0, 9.5, 1.0, True),   # the move keeps its own bound, 5 x ||w_t|| = 10 ...
    (0.0, 10.5, 1.0, False),  # ... not divided by the lr
])
def test_scaffold_delta_c_first_round_bound(c_norm: float, move: float, dc: float,
                                            kept: bool) -> None:
    """Guards Delta_c's bound without history: ||c|| + 5 ||w_t|| / eta_t, with eta_t the lr
    of THIS round (round 3, lr 0.05 x 0.5^2 = 0.0125): 0 + 10 / 0.0125 = 800, or 850 with
    ||c|| = 50 (c from a checkpoint that predates the norm history)."""
    s = scaffold(**{"lr": 0.05, "lr-decay": 0.5})
    w_t = model(2.0)
    if c_norm:
        s.load_server_state({"c": [(c_norm * a).astype(np.float32) for a in unit(3)]})
    got, metrics = play(s, 3, [move], w_t, delta_c=[dc])
    assert metrics["num-rejected"] == (0 if kept else 1)
    assert (got is not None) == kept
