"""Krum, Multi-Krum and Bulyan against hand-computed cases; every method's extra uploads
combined by the round's rule (SCAFFOLD's c, FedCM's K); the config refusals.

The hand cases use 1- and 2-coordinate vectors whose squared distances can be summed on
paper (numbers in each docstring). The strategy tests drive SCAFFOLD's server half through
Flower's Strategy API (``MethodStrategy.configure_train`` / ``aggregate_train``).
"""

from __future__ import annotations

import logging
from typing import cast

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.config import ConfigError, RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.fedcm import FedCmParams, FedCmServer, FedCmState
from fedinit.methods.method import ClientUpdate, RoundInput
from fedinit.methods.packed_arrays import unpack
from fedinit.methods.robust import combine, select
from fedinit.methods.scaffold import DELTA_C
from fedinit.methods.weights import Weights
from strategies.method_strategy import MethodStrategy


def pt(*xs: float) -> Weights:
    """A vector with one array per coordinate (so 'joint' spans several arrays)."""
    return [np.asarray([x], dtype=np.float32) for x in xs]


# ---------------------------------------------------------------- Krum / Multi-Krum by hand
# 1-D points a=0, b=1, c=3, d=10, e=20; n=5, f=1: each scores its n-f-2 = 2 nearest:
# a: 1+9=10, b: 1+4=5, c: 4+9=13, d: 49+81=130, e: 100+289=389.
LINE = [pt(0), pt(1), pt(3), pt(10), pt(20)]


def test_krum_picks_the_lowest_score() -> None:
    assert select(LINE, "krum", 1) == [1]
    assert combine([LINE[1]], [1.0], "krum", 0.0, 1)[0][0] == 1.0


def test_multi_krum_keeps_the_n_minus_f_lowest_and_takes_their_unweighted_mean() -> None:
    """Keeps b, a, c, d (scores 5, 10, 13, 130), drops e (389); the claimed weights 1, 1, 2, 4
    get no say: (0 + 1 + 3 + 10) / 4 (the weighted mean would be 47 / 8)."""
    chosen = select(LINE, "multi-krum", 1)
    assert chosen == [0, 1, 2, 3]
    got = combine([LINE[i] for i in chosen], [1.0, 1.0, 2.0, 4.0], "multi-krum", 0.0, 1)
    assert got[0][0] == pytest.approx(14.0 / 4.0)


def test_krum_looks_at_every_array_of_an_upload() -> None:
    """One upload of two arrays (shapes (3,), (1,): one channel): the first is the same for
    all, the second alone decides: 0, 1, 3, 10, 20 -> b, as in the 1-D case. Judged by its
    first array alone all would tie (scores 0) and Krum would pick index 0."""
    joint = [[np.zeros(3, np.float32), x[0]] for x in LINE]
    assert select(joint, "krum", 1) == [1]
    assert select([[v[0]] for v in joint], "krum", 1) == [0]


# ---------------------------------------------------------------- Bulyan by hand
# n=7, f=1: theta = 5 selected by Multi-Krum, beta = 3 averaged per coordinate.
# Honest (x, y): (0,4) (1,0) (2,3) (3,1) (10,9); attackers (50,50) (-40,-40).
BULYAN = [pt(0, 4), pt(1, 0), pt(2, 3), pt(3, 1), pt(10, 9), pt(50, 50), pt(-40, -40)]


def test_bulyan_selects_theta_and_trims_each_coordinate_around_its_median() -> None:
    """Selected: the five honest (the attackers' 4 nearest are >= 40^2 away). x: 0,1,2,3,10,
    median 2, the 3 nearest 1,2,3 -> 2 (10 trimmed). y: 4,0,3,1,9, median 3, the 3 nearest
    3,4,1 -> 8/3 (0 and 9 trimmed). The plain mean of the selected would be (3.2, 3.4).
    Read as one upload of two arrays (``channels=1``, the sums above) or, as the shapes
    suggest, as two one-array uploads x and y judged each on its own: the same five."""
    chosen = select(BULYAN, "bulyan", 1, channels=1)
    assert chosen == [0, 1, 2, 3, 4]
    assert select(BULYAN, "bulyan", 1) == chosen
    got = combine([BULYAN[i] for i in chosen], [1.0] * 5, "bulyan", 0.0, 1)
    assert got[0][0] == pytest.approx(2.0)
    assert got[1][0] == pytest.approx(8.0 / 3.0)
    assert all(a.dtype == np.float32 for a in got)


@pytest.mark.parametrize(("kind", "n", "ok"), [
    ("krum", 4, False), ("krum", 5, True), ("multi-krum", 4, False),
    ("bulyan", 6, False), ("bulyan", 7, True)])
def test_too_few_replies_select_nothing(kind: str, n: int, ok: bool) -> None:
    """Krum needs n > 2f + 2, Bulyan n >= 4f + 3 (f = 1)."""
    assert (select(BULYAN[:n], kind, 1) is not None) is ok


@pytest.mark.parametrize("kind", ["mean", "median", "trimmed-mean"])
def test_coordinate_rules_select_every_reply(kind: str) -> None:
    assert select(LINE, kind, 1) == [0, 1, 2, 3, 4]


# ---------------------------------------------------------------- FedCM's K
def fedcm_round(kind: str, steps: list[int], weights: list[float]) -> float:
    """FedCM's d after one round with D = 1 everywhere; returns K from d = -D / (K lr)."""
    ups = [ClientUpdate(partition_id=i, upload=pt(0.0), extras={}, num_examples=1,
                        train_loss=0.0, num_steps=s) for i, s in enumerate(steps)]
    rnd = RoundInput(server_round=1, aggregate=pt(1.0), updates=ups, weights=weights,
                     variant="update", num_clients=len(steps), lr=0.5, server_lr=1.0,
                     combine=lambda v, w: combine(v, w, kind, 0.2, 1), aggregation=kind)
    _, state = FedCmServer(FedCmParams(fedcm_alpha=0.5)).update(FedCmState(d=pt(0.0)),
                                                                pt(0.0), rnd)
    return -1.0 / (float(state.d[0][0]) * 0.5)


@pytest.mark.parametrize(("kind", "want"), [
    ("mean", (1 * 1 + 2 * 1 + 30 * 2) / 4),  # example-weighted, as D under mean
    ("median", 2.0),                         # the median step count; weights ignored, as D
    ("trimmed-mean", (1 + 2 + 30) / 3),      # floor(0.2 * 3) = 0 cut: unweighted mean
])
def test_fedcm_k_is_combined_like_d(kind: str, want: float) -> None:
    assert fedcm_round(kind, [1, 2, 30], [1.0, 1.0, 2.0]) == pytest.approx(want, rel=1e-6)


# ---------------------------------------------------------------- through the strategy
SHAPES = [(3, 2), (4,)]
RNG = np.random.default_rng(5)
W_T: Weights = [RNG.standard_normal(s).astype(np.float32) for s in SHAPES]


def scaffold_server(aggregation: str, n: int, fraction: float,
                    min_replies: int = 1) -> MethodStrategy:
    set_task_identity()
    cfg = RunConfig.parse({"method": "scaffold", "num-clients": n, "fraction-train": fraction,
                           "beta": 0.0, "aggregation": aggregation, "byzantine-f": 1,
                           "max-update-norm-ratio": 0.0, "min-replies": min_replies,
                           "output-dir": "/tmp/unused"})
    return MethodStrategy(cfg, {p: 1000 + p for p in range(n)}, W_T, examples=[10] * n)


def scaffold_round(s: MethodStrategy, moves: dict[int, Weights],
                   dcs: dict[int, Weights]) -> tuple[Weights, Weights] | None:
    """One round: sampled client i moves by moves[i] and uploads Delta_c = dcs[i]; replies
    only from the clients in ``moves``. (w_next, c) or None when not aggregated."""
    msgs = list(s.configure_train(1, ArrayRecord(W_T), ConfigRecord(), cast(Grid, None)))
    replies = []
    for msg in msgs:
        i = msg.metadata.dst_node_id - 1000
        if i not in moves:
            continue
        up = [(w + d).astype(np.float32) for w, d in zip(W_T, moves[i], strict=True)]
        content = RecordDict({rk.ARRAYS: ArrayRecord(up), DELTA_C: ArrayRecord(dcs[i]),
                              rk.METRICS: MetricRecord({rk.NUM_EXAMPLES: 10,
                                                        rk.TRAIN_LOSS: 0.1, rk.NUM_STEPS: 1}),
                              rk.CONFIG: ConfigRecord({rk.UPLOAD_DELTA: False})})
        replies.append(Message(content=content, reply_to=msg))
    arrays, _ = s.aggregate_train(1, replies)
    if arrays is None:
        return None
    return unpack(arrays), s.state.arrays()["c"]


def rand(seed: int, scale: float = 1.0) -> Weights:
    rng = np.random.default_rng(seed)
    return [(scale * rng.standard_normal(sh)).astype(np.float32) for sh in SHAPES]


def test_scaffold_c_under_median_is_m_over_n_times_the_median_like_the_model() -> None:
    """3 of 5 clients sampled: w_next = w_t + median(moves) and c = (3/5) * median(Delta_c),
    both coordinate-wise over the same three replies; Delta_c of one is 1e3 x larger and
    does not get in (the plain sum would carry it)."""
    s = scaffold_server("median", 5, 0.6)
    sampled = sorted(m.metadata.dst_node_id - 1000 for m in s.configure_train(
        1, ArrayRecord(W_T), ConfigRecord(), cast(Grid, None)))
    assert len(sampled) == 3
    moves = {i: rand(i) for i in sampled}
    dcs = {i: rand(10 + i, 1e3 if i == sampled[0] else 1.0) for i in sampled}
    out = scaffold_round(s, moves, dcs)
    assert out is not None
    w_next, c = out
    for k in range(len(SHAPES)):
        med_move = np.median(np.stack([moves[i][k] for i in sampled]), axis=0)
        med_dc = np.median(np.stack([dcs[i][k] for i in sampled]), axis=0)
        np.testing.assert_allclose(w_next[k], W_T[k] + med_move, atol=1e-5)
        np.testing.assert_allclose(c[k], 0.6 * med_dc, rtol=1e-5, atol=1e-6)
    assert max(float(np.abs(a).max()) for a in c) < 10.0


def test_scaffold_under_krum_selects_on_the_move_and_screens_an_outlying_delta_c() -> None:
    """5 of 5 sampled, f = 1, every coordinate of client i's move m_i and Delta_c d_i equal:
    m = (.02, .01, .02, .03, .05), d = (5, .01, .02, .03, .05). Scores on the move over the
    2 nearest (x 1e-4, per coordinate): 0 + 1, 1 + 1, 0 + 1, 1 + 1, 4 + 9 = 1, 2, 1, 2, 13:
    clients 0 and 2 tie and Krum picks 0 (the lower index), as Flower's Krum on the moves.
    On Delta_c client 0 scores about 49 against a median of 5e-4 (1e5 x): screened. So
    w_next = w_t + m_0, c stays 0 (no Delta_c counted) and no client is accounted: client
    0's c_i rolls back. (The rule before ranked by the worse of the two uploads and picked
    client 2: Delta_c decided between equal moves.)"""
    s = scaffold_server("krum", 5, 1.0)
    m = [0.02, 0.01, 0.02, 0.03, 0.05]
    d = [5.0, 0.01, 0.02, 0.03, 0.05]
    moves = {i: [np.full(sh, m[i], np.float32) for sh in SHAPES] for i in range(5)}
    dcs = {i: [np.full(sh, d[i], np.float32) for sh in SHAPES] for i in range(5)}
    out = scaffold_round(s, moves, dcs)
    assert out is not None
    w_next, c = out
    for k in range(len(SHAPES)):
        np.testing.assert_allclose(w_next[k], W_T[k] + 0.02, atol=1e-6)
        np.testing.assert_array_equal(c[k], 0.0)
    assert not s.accounted  # client 0's c_i is not counted: it rolls back
    # the same round with client 0's Delta_c in line: client 0 is picked and counted
    s = scaffold_server("krum", 5, 1.0)
    dcs[0] = [np.full(sh, 0.02, np.float32) for sh in SHAPES]
    out = scaffold_round(s, moves, dcs)
    assert out is not None
    for k in range(len(SHAPES)):
        np.testing.assert_allclose(out[0][k], W_T[k] + 0.02, atol=1e-6)
        np.testing.assert_allclose(out[1][k], 0.02 / 5, rtol=1e-6)
    assert s.accounted == {0: 1}


def test_scaffold_krum_does_not_pick_a_flipped_move_behind_the_mean_delta_c() -> None:
    """5 of 5 sampled, f = 1. Honest moves u + noise, honest Delta_c 4 (v + noise) (noise as
    large as the signal); client 0
    flips its move and uploads the mean honest Delta_c. Read as one concatenated vector (the
    rule before, ``channels=1``) Krum picks client 0 on these very vectors: the oracle. The
    server judges the move and Delta_c each on its own scale (2 channels, read from the
    shapes), picks an honest client and applies that reply whole."""
    seen: list[Weights] = []
    for seed in range(50):
        rng = np.random.default_rng(seed)
        u, v = rand(100 + seed), rand(200 + seed)
        moves = {i: [(a + rng.standard_normal(a.shape)).astype(np.float32) for a in u]
                 for i in range(5)}
        dcs = {i: [(4 * (a + rng.standard_normal(a.shape))).astype(np.float32)
                   for a in v] for i in range(5)}
        moves[0] = [-a for a in moves[0]]
        dcs[0] = [np.mean([dcs[i][k] for i in range(1, 5)], axis=0).astype(np.float32)
                  for k in range(len(SHAPES))]
        # what the server sees: the move as upload - w_t, then Delta_c
        seen = [[*((w + d).astype(np.float32).astype(np.float64) - w
                   for w, d in zip(W_T, moves[i], strict=True)), *dcs[i]] for i in range(5)]
        if select(seen, "krum", 1, channels=1) == [0]:
            break
    assert select(seen, "krum", 1, channels=1) == [0]
    pick = select(seen, "krum", 1)
    assert pick is not None and pick != [0]
    s = scaffold_server("krum", 5, 1.0)
    out = scaffold_round(s, moves, dcs)
    assert out is not None
    w_next, c = out
    for k in range(len(SHAPES)):
        np.testing.assert_allclose(w_next[k], W_T[k] + moves[pick[0]][k], atol=1e-6)
        np.testing.assert_allclose(c[k], dcs[pick[0]][k] / 5, rtol=1e-5, atol=1e-7)
    assert s.accounted == {pick[0]: 1}


def test_krum_with_too_few_replies_skips_the_round(caplog: pytest.LogCaptureFixture) -> None:
    """5 sampled, 4 replies, f = 1: Krum needs 5; the round is not aggregated, logged."""
    s = scaffold_server("krum", 5, 1.0)
    moves = {i: rand(i) for i in range(4)}
    with caplog.at_level(logging.WARNING):
        assert scaffold_round(s, moves, {i: rand(20 + i) for i in range(4)}) is None
    assert "4 usable replies < 5 that aggregation=krum needs with byzantine-f=1" in caplog.text


def test_mean_sum_of_is_the_exact_sum() -> None:
    """Under ``mean`` SCAFFOLD's sum stays the float64 sum (bit-identical results)."""
    vecs = [rand(i) for i in range(4)]
    rnd = RoundInput(server_round=1, aggregate=[], updates=[], weights=[], variant="model",
                     num_clients=4, lr=0.1, server_lr=1.0)
    got = rnd.sum_of(vecs)
    for k in range(len(SHAPES)):
        want = np.zeros(SHAPES[k])
        for v in vecs:
            want += v[k]
        assert got[k].tobytes() == want.tobytes()


# ---------------------------------------------------------------- config refusals
@pytest.mark.parametrize(("over", "message"), [
    ({"method": "feddyn", "aggregation": "median"},
     "aggregation='median' is not allowed; allowed: mean with method='feddyn' (FedDyn's H"),
    ({"aggregation": "bulyan", "num-clients": 10, "fraction-train": 0.6},
     "byzantine-f=1 is not allowed; allowed: at most what aggregation='bulyan' tolerates in 6"),
    ({"aggregation": "krum", "num-clients": 10, "fraction-train": 0.4, "byzantine-f": 1},
     "tolerates in 4 clients per round (n > 2f + 2"),
    ({"aggregation": "multi-krum", "byzantine-f": -1}, "byzantine-f=-1 is not allowed"),
])
def test_config_refusals_are_one_line(over: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**over, "output-dir": "/tmp/unused"})
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("over", [
    {"aggregation": "bulyan", "num-clients": 10, "fraction-train": 0.7},
    {"aggregation": "krum", "num-clients": 10, "fraction-train": 0.5},
    {"aggregation": "mean", "num-clients": 2, "fraction-train": 0.5, "byzantine-f": 3},
    {"method": "feddyn", "aggregation": "mean"},
    {"method": "scaffold", "aggregation": "median"},
])
def test_allowed_combinations_parse(over: dict[str, object]) -> None:
    RunConfig.parse({**over, "output-dir": "/tmp/unused"})
