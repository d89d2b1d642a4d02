"""RI's math against values computed by hand on tiny arrays."""

import numpy as np
import pytest

from fedinit.methods.ri import aggregate_update, divergence, relaxed_start, upload_vector


def f32(*xs: float) -> np.ndarray:
    return np.array(xs, dtype=np.float32)


def test_relaxed_start_by_hand() -> None:
    w = [f32(1.0, 2.0), f32(-4.0)]
    w_prev = [f32(0.0, 3.0), f32(-2.0)]
    s = relaxed_start(w, w_prev, 0.5)
    # 1 + .5*(1-0) = 1.5 ; 2 + .5*(2-3) = 1.5 ; -4 + .5*(-4+2) = -5
    np.testing.assert_array_equal(s[0], f32(1.5, 1.5))
    np.testing.assert_array_equal(s[1], f32(-5.0))
    assert s[0].dtype == np.float32


def test_negative_beta_by_hand() -> None:
    s = relaxed_start([f32(2.0)], [f32(1.0)], -0.25)
    np.testing.assert_array_equal(s[0], f32(1.75))


def test_beta_zero_is_bitwise_the_global_model_and_a_copy() -> None:
    w = [np.random.default_rng(0).standard_normal(5).astype(np.float32)]
    w_prev = [np.full(5, np.nan, dtype=np.float32)]  # would poison any arithmetic
    s = relaxed_start(w, w_prev, 0.0)
    assert s[0].tobytes() == w[0].tobytes()
    s[0][0] = 99.0
    assert w[0][0] != 99.0


def test_model_variant_averages_final_models() -> None:
    w_t = [f32(1.0, 1.0)]
    finals = [[f32(3.0, 0.0)], [f32(0.0, 6.0)]]
    update, seen = aggregate_update(w_t, finals, [1.0, 3.0], "model")
    # weighted mean = (3*1 + 0*3)/4, (0*1 + 6*3)/4 = (0.75, 4.5); minus w_t
    np.testing.assert_allclose(update[0], f32(-0.25, 3.5))
    assert seen is not None and seen[1][0].tolist() == [0.0, 6.0]


def test_update_variant_averages_deltas_and_drops_offsets() -> None:
    w_t = [f32(1.0, 1.0)]
    # client starts s_i = w_t + offset; uploads Delta_i = final - s_i
    starts = [[f32(1.5, 1.0)], [f32(1.0, 0.0)]]
    finals = [[f32(2.5, 1.0)], [f32(1.0, 2.0)]]
    uploads = [upload_vector(f, s, "update") for f, s in zip(finals, starts, strict=True)]
    np.testing.assert_array_equal(uploads[0][0], f32(1.0, 0.0))
    update, seen = aggregate_update(w_t, uploads, [1.0, 1.0], "update")
    np.testing.assert_allclose(update[0], f32(0.5, 1.0))
    # the server's view of the final models lacks the offsets: w_t + Delta_i
    np.testing.assert_allclose(seen[0][0], f32(2.0, 1.0))


def test_variants_agree_without_offsets() -> None:
    rng = np.random.default_rng(1)
    w_t = [rng.standard_normal(4).astype(np.float32)]
    finals = [[rng.standard_normal(4).astype(np.float32)] for _ in range(3)]
    ups = [upload_vector(f, w_t, "update") for f in finals]
    a, _ = aggregate_update(w_t, finals, [1.0, 2.0, 3.0], "model")
    b, _ = aggregate_update(w_t, ups, [1.0, 2.0, 3.0], "update")
    np.testing.assert_allclose(a[0], b[0], atol=1e-6)


def test_divergence_by_hand() -> None:
    finals = [[f32(1.0, 0.0)], [f32(0.0, 2.0)]]
    w_next = [f32(0.0, 0.0)]
    # (1 + 4) / 2
    assert divergence(finals, w_next) == pytest.approx(2.5)
