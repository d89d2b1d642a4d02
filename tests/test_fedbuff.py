"""FedBuff's pure rule against staleness values worked by hand and a flush computed here."""

from __future__ import annotations

import numpy as np
import pytest

from fedinit.methods.fedbuff import BufferedUpdate, FedBuff, delta_of, staleness_weight


def test_staleness_values_by_hand() -> None:
    assert staleness_weight("constant", 7, 0.5, 0.0) == 1.0
    assert staleness_weight("poly", 0, 0.5, 0.0) == 1.0
    assert staleness_weight("poly", 3, 0.5, 0.0) == pytest.approx(0.5)  # 4^-0.5
    assert staleness_weight("poly", 1, 1.0, 0.0) == pytest.approx(0.5)  # 2^-1
    assert staleness_weight("poly", 8, 1 / 3, 0.0) == pytest.approx(1 / 9 ** (1 / 3))
    assert staleness_weight("hinge", 2, 0.5, 2.0) == 1.0  # tau <= b
    assert staleness_weight("hinge", 6, 0.5, 2.0) == pytest.approx(1 / 3)  # 1/(0.5*4+1)
    assert staleness_weight("hinge", 3, 2.0, 0.0) == pytest.approx(1 / 7)
    with pytest.raises(ValueError, match="staleness='linear' is not allowed"):
        staleness_weight("linear", 1, 0.5, 0.0)
    with pytest.raises(ValueError, match="negative"):
        staleness_weight("poly", -1, 0.5, 0.0)


def _vec(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=4).astype(np.float32)]


def test_flush_equals_the_formula_written_here() -> None:
    rng = np.random.default_rng(0)
    w = _vec(rng)
    buf = FedBuff(buffer_size=3, server_lr=0.7, staleness="poly", a=0.5, max_staleness=2)
    buf.version = 4
    offers = [(_vec(rng), 4, 10.0), (_vec(rng), 1, 5.0), (_vec(rng), 3, 20.0),
              (_vec(rng), 2, 7.0)]  # version 1: tau 3 > 2, dropped
    kept = [buf.offer(BufferedUpdate(d, v, n, client=i)) for i, (d, v, n) in enumerate(offers)]
    assert kept == [True, False, True, True] and buf.full
    out = buf.flush(w)
    # by hand: taus 0, 1, 2 -> s = 1, 2^-0.5, 3^-0.5; weights 10, 20, 7 of 37
    s = {0: 1.0, 2: 1 / np.sqrt(2.0), 3: 1 / np.sqrt(3.0)}
    for layer in range(2):
        step = sum(s[i] * offers[i][2] / 37.0 * offers[i][0][layer].astype(np.float64)
                   for i in (0, 2, 3))
        want = w[layer].astype(np.float64) + 0.7 * step
        np.testing.assert_allclose(out.weights[layer], want.astype(np.float32), rtol=1e-6)
        assert out.weights[layer].dtype == np.float32
    assert out.version == 5 and buf.version == 5 and buf.buffer == []
    assert out.staleness == (0, 1, 2) and out.dropped == 1 and out.clients == (0, 2, 3)
    assert out.factors == pytest.approx((1.0, 2 ** -0.5, 3 ** -0.5))
    assert buf.dropped == 0  # counted once, in the flush that reports it


def test_uniform_weights_and_constant_staleness_are_the_paper_sum_over_k() -> None:
    rng = np.random.default_rng(1)
    w = _vec(rng)
    deltas = [_vec(rng) for _ in range(4)]
    buf = FedBuff(buffer_size=4, server_lr=1.0)
    for d in deltas:
        buf.offer(BufferedUpdate(d, 0, 1.0))
    out = buf.flush(w)
    for layer in range(2):
        want = w[layer] + sum(d[layer] for d in deltas) / 4
        np.testing.assert_allclose(out.weights[layer], want, rtol=1e-5, atol=1e-6)


def test_no_limit_keeps_stale_replies_and_bad_input_fails() -> None:
    buf = FedBuff(buffer_size=1, server_lr=1.0, max_staleness=0)
    buf.version = 100
    assert buf.offer(BufferedUpdate([np.zeros(1, np.float32)], 0, 1.0))
    with pytest.raises(ValueError, match="newer than the server's version"):
        buf.offer(BufferedUpdate([np.zeros(1, np.float32)], 101, 1.0))
    with pytest.raises(ValueError, match="buffer-size=0"):
        FedBuff(buffer_size=0, server_lr=1.0)
    with pytest.raises(ValueError, match="empty buffer"):
        FedBuff(buffer_size=1, server_lr=1.0).flush([np.zeros(1, np.float32)])


def test_delta_of_each_variant() -> None:
    start = [np.array([1.0, 2.0], np.float32)]
    final = [np.array([1.5, 1.0], np.float32)]
    np.testing.assert_array_equal(delta_of(final, start, "model")[0], [0.5, -1.0])
    assert delta_of(final, start, "update")[0] is final[0]
