"""Delay compensation of a stale reply (``stale-correction=dc``), pure numpy.

Why: under ``rounds=async`` a reply's update Delta_i was computed at the version w_sent its
task carried, but is applied at the server's newest w_now; with concurrency = buffer-size
nearly every reply is a version stale (docs/benchmarks.md, "The gap after the same number of
updates"). DC-ASGD (Zheng et al., ICML 2017) corrects a stale gradient with a first-order
Taylor term, g(w_now) ~ g(w_sent) + H (w_now - w_sent), the Hessian H approximated by
lambda g (.) g. Adapted to a client's whole local task (docs/algorithms.md, FedBuff: stale
correction): Delta(w_now) ~ Delta(w_sent) + J (w_now - w_sent), J = dDelta/dw_start, whose
diagonal lies in [-1, 0] for a stable local run (0: the task ignores its start, -1: it undoes
any shift of it); -J's diagonal, the contraction, is estimated per tensor as
clip(lambda * Delta (.) Delta / mean(Delta (.) Delta), 0, 1), so lambda is dimensionless: the
mean contraction over a tensor's coordinates.
"""

from __future__ import annotations

import numpy as np

from fedinit.methods.weights import Weights


def dc_contraction(delta: np.ndarray, lam: float) -> np.ndarray:
    """-J's diagonal for one tensor: lambda Delta^2 / mean(Delta^2), clipped to [0, 1]
    (0 where the tensor's update is all zero: nothing to estimate from)."""
    sq = np.square(delta.astype(np.float64))
    scale = float(sq.mean()) if sq.size else 0.0
    if scale == 0.0:
        return np.zeros_like(sq)
    return np.clip(lam * sq / scale, 0.0, 1.0)


def delay_compensated(delta: Weights, sent: Weights, now: Weights, lam: float) -> Weights:
    """Delta_c = Delta - contraction (.) (w_now - w_sent), tensor by tensor (float64 inside, each
    tensor back in its own dtype); ``lam`` = 0 or w_now = w_sent gives Delta back."""
    if lam < 0.0:
        raise ValueError(f"dc-lambda={lam} is not allowed; allowed: a number >= 0")
    if not len(delta) == len(sent) == len(now):
        raise ValueError(f"delay compensation needs as many tensors in Delta ({len(delta)}), "
                         f"w_sent ({len(sent)}) and w_now ({len(now)})")
    out = []
    for d, s, n in zip(delta, sent, now, strict=True):
        shift = n.astype(np.float64) - s.astype(np.float64)
        out.append((d.astype(np.float64) - dc_contraction(d, lam) * shift).astype(d.dtype))
    return out
