"""Extra feature heterogeneity from the paper: per-client RGB scaling, per-class brightness.

Both work on uint8 images through 256-entry lookup tables, so they cost one gather per pixel
and no float copy of the data set. Random draws come from seeded generators with a domain tag,
so the two kinds of noise never share a stream and the same (seed, client) or (seed, class)
always gets the same draw, whichever subset of the data is transformed.
"""

from __future__ import annotations

import numpy as np

# Tags separating the random streams of the two noise kinds under one seed.
_CHANNEL_STREAM = 1
_BRIGHTNESS_STREAM = 2
_LEVELS = np.arange(256, dtype=np.float64)


def _check(x: np.ndarray, sigma: float) -> None:
    """Reject non-uint8 images, images without a channel axis, and bad sigmas."""
    if x.dtype != np.uint8:
        raise ValueError(f"images must be uint8, got {x.dtype}")
    if x.ndim < 3:
        raise ValueError(f"images must end with (H, W, C), got shape {x.shape}")
    if not (np.isfinite(sigma) and sigma >= 0):
        raise ValueError(f"sigma must be a finite number >= 0, got {sigma}")


def _lookup(table: np.ndarray) -> np.ndarray:
    """Round and clip a float table of pixel values into a uint8 lookup table."""
    return np.clip(np.rint(table), 0, 255).astype(np.uint8)


def client_channel_scale(x: np.ndarray, client_id: int, sigma: float, seed: int) -> np.ndarray:
    """Scale each colour channel by 1 + N(0, sigma), drawn per (seed, client): client bias."""
    _check(x, sigma)
    if sigma == 0:
        return x.copy()
    if client_id < 0 or seed < 0:
        raise ValueError(f"client_id and seed must be >= 0, got {client_id} and {seed}")
    rng = np.random.default_rng([seed, _CHANNEL_STREAM, client_id])
    scales = 1.0 + rng.normal(0.0, sigma, size=x.shape[-1])
    out = np.empty_like(x)
    for channel, scale in enumerate(scales):
        out[..., channel] = _lookup(_LEVELS * scale)[x[..., channel]]
    return out


def class_brightness_shift(x: np.ndarray, y: np.ndarray, sigma: float, seed: int) -> np.ndarray:
    """Add 255 * N(0, sigma) to every pixel of class c, drawn once per (seed, class).

    Drawing per class (not per call) gives a class the same shift in every client's subset.
    Only clients' training data is shifted (``fedinit/task/federated_data.py``); the central test
    set stays clean (``server_app/central_eval.py``), so accuracy is measured on the data set's
    own distribution whatever noise the clients trained with.
    """
    _check(x, sigma)
    y = np.asarray(y)
    if y.shape != (x.shape[0],):
        raise ValueError(f"labels must have shape ({x.shape[0]},), got {y.shape}")
    if sigma == 0:
        return x.copy()
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    out = np.empty_like(x)
    for cls in np.unique(y):
        if cls < 0:
            raise ValueError(f"labels must be >= 0, got {cls}")
        shift = np.random.default_rng([seed, _BRIGHTNESS_STREAM, int(cls)]).normal(0.0, sigma)
        mask = y == cls
        out[mask] = _lookup(_LEVELS + 255.0 * shift)[x[mask]]
    return out
