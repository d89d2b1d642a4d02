"""Noise tests: identity at sigma 0, seeded determinism, per-client and per-class structure."""

from __future__ import annotations

import numpy as np
import pytest

from fedinit.task.noise import class_brightness_shift, client_channel_scale


def _images(n: int = 40, channels: int = 3) -> np.ndarray:
    # Mid-grey images with texture, so shifts and scales are rarely clipped.
    rng = np.random.default_rng(0)
    return rng.integers(60, 190, size=(n, 8, 8, channels), dtype=np.uint8)


def test_sigma_zero_is_identity() -> None:
    x = _images()
    y = np.arange(len(x)) % 4
    for out in (client_channel_scale(x, 3, 0.0, seed=1), class_brightness_shift(x, y, 0.0, 1)):
        assert out.dtype == np.uint8
        assert np.array_equal(out, x)


def test_channel_scale_deterministic_and_per_client() -> None:
    x = _images()
    a = client_channel_scale(x, 5, 0.2, seed=7)
    assert a.dtype == np.uint8 and a.shape == x.shape
    assert np.array_equal(a, client_channel_scale(x, 5, 0.2, seed=7))
    assert not np.array_equal(a, client_channel_scale(x, 6, 0.2, seed=7))
    assert not np.array_equal(a, client_channel_scale(x, 5, 0.2, seed=8))


def test_channel_scale_is_a_per_channel_factor() -> None:
    x = np.full((2, 4, 4, 3), 100, dtype=np.uint8)
    out = client_channel_scale(x, 0, 0.3, seed=0).astype(np.float64)
    per_channel = out.reshape(-1, 3)
    assert np.all(per_channel == per_channel[0])  # one factor per channel
    assert len(set(per_channel[0].tolist())) == 3  # channels scaled differently
    big = client_channel_scale(np.full((1, 2, 2, 3), 250, np.uint8), 0, 5.0, seed=0)
    assert big.min() >= 0 and big.max() <= 255


def test_brightness_same_within_class_differs_across() -> None:
    x = np.full((30, 4, 4, 1), 128, dtype=np.uint8)
    y = np.arange(30) % 3
    out = class_brightness_shift(x, y, 0.1, seed=2).astype(np.int64) - 128
    shifts = [np.unique(out[y == c]) for c in range(3)]
    assert all(s.size == 1 for s in shifts)  # equal within a class
    assert len({int(s[0]) for s in shifts}) == 3  # different across classes
    assert np.array_equal(class_brightness_shift(x, y, 0.1, seed=2), out.astype(np.uint8) + 128)
    # The same class gets the same shift in any subset (train vs test consistency).
    subset = class_brightness_shift(x[y == 1], y[y == 1], 0.1, seed=2).astype(np.int64) - 128
    assert np.unique(subset).tolist() == shifts[1].tolist()


def test_brightness_clips() -> None:
    x = np.array([0, 255], dtype=np.uint8).reshape(2, 1, 1, 1)
    out = class_brightness_shift(x, np.array([0, 0]), 10.0, seed=0)
    assert out.dtype == np.uint8 and set(out.ravel().tolist()) <= {0, 255}


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="uint8"):
        client_channel_scale(np.zeros((1, 2, 2, 3), np.float32), 0, 0.1, 0)
    with pytest.raises(ValueError, match="sigma"):
        class_brightness_shift(_images(), np.zeros(40, int), -1.0, 0)


def test_noise_shifts_client_data_but_not_the_central_test_set() -> None:
    """As the docstrings say: clients train on shifted images, the server scores clean ones."""
    import torch

    from fedinit.config import RunConfig
    from fedinit.task.datasets import to_tensor
    from fedinit.task.federated_data import client_examples, client_indices, dataset_of
    from server_app.central_eval import CentralEvaluator

    cfg = RunConfig.parse({"train-limit": 1000, "brightness-noise": 0.2, "channel-noise": 0.2})
    data = dataset_of(cfg)
    x, _ = client_examples(cfg, 0)
    assert not np.array_equal(x, data.train_x[client_indices(cfg, 0)])
    evaluator = CentralEvaluator(cfg)
    clean = to_tensor(data.test_x, data.mean, data.std)
    assert torch.equal(evaluator.x.cpu(), clean)
