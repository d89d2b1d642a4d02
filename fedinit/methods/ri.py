"""RI, personalized relaxed initialization: the piece every method composes with.

Client side: the start point s_i = w_t + beta * (w_t - w_prev_i) and what is uploaded.
Server side: what the round's aggregate update D is, under either aggregation variant
(``docs/algorithms.md``, Rules):
- ``model`` (Algorithm 1): clients upload their final model w_iK; D = avg(w_iK) - w_t.
- ``update`` (authors' code): clients upload Delta_i = w_iK - s_i; D = avg(Delta_i).
Both upload exactly one model-sized vector, so RI costs no extra bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedinit.methods.weights import Weights


def relaxed_start(w: Weights, w_prev: Weights, beta: float) -> Weights:
    """s = w + beta * (w - w_prev); beta = 0 returns an exact copy of w (the plain method)."""
    if beta == 0.0:
        return [a.copy() for a in w]
    return [(a + beta * (a - p)).astype(a.dtype) for a, p in zip(w, w_prev, strict=True)]


def upload_vector(final: Weights, start: Weights, variant: str) -> Weights:
    """What the client sends up: its final model (``model``) or its update (``update``)."""
    if variant == "model":
        return final
    return [f - s for f, s in zip(final, start, strict=True)]


def weighted_mean(vectors: Sequence[Weights], weights: Sequence[float]) -> Weights:
    """Weighted average of model-shaped vectors, accumulated in float64, returned as float32."""
    total = float(sum(weights))
    out = [np.zeros(a.shape, dtype=np.float64) for a in vectors[0]]
    for vec, wgt in zip(vectors, weights, strict=True):
        for acc, a in zip(out, vec, strict=True):
            acc += (wgt / total) * a.astype(np.float64)
    return [a.astype(np.float32) for a in out]


def aggregate_update(
    w_t: Weights, uploads: Sequence[Weights], weights: Sequence[float], variant: str,
    mean: Callable[[Sequence[Weights], Sequence[float]], Weights] | None = None,
) -> tuple[Weights, list[Weights]]:
    """The round's aggregate update D and the clients' final models as the server sees them.

    Under ``update`` the server never sees a client's offset, so its view of a final model is
    w_t + Delta_i (used for the divergence term only). ``mean`` replaces the weighted mean
    (robust aggregation).
    """
    avg = (mean or weighted_mean)(uploads, weights)
    if variant == "model":
        update = [(m.astype(np.float64) - w.astype(np.float64)).astype(np.float32)
                  for m, w in zip(avg, w_t, strict=True)]
        return update, list(uploads)
    finals = [[w + d for w, d in zip(w_t, up, strict=True)] for up in uploads]
    return avg, finals


def divergence(finals: Sequence[Weights], w_next: Weights) -> float:
    """The paper's consistency term: (1/|S|) * sum_i ||w_iK - w_{t+1}||^2."""
    total = 0.0
    for vec in finals:
        total += sum(float(np.sum((a.astype(np.float64) - b) ** 2)) for a, b in
                     zip(vec, w_next, strict=True))
    return total / len(finals)
