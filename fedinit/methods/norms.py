"""Norms of model-shaped vectors: what the norm filter measures, and SCAFFOLD's bound uses."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedinit.methods.weights import Weights


def vector_norm(vector: Weights) -> float:
    """Euclidean norm of a model-shaped vector, accumulated in float64."""
    return sum(float(np.sum(a.astype(np.float64) ** 2)) for a in vector) ** 0.5


def update_norms(w_t: Weights, uploads: Sequence[Weights], variant: str) -> list[float]:
    """Norm of each client's move: ||w_iK - w_t|| (model variant) or ||Delta_i|| (update)."""
    if variant != "model":
        return [vector_norm(up) for up in uploads]
    return [vector_norm([u.astype(np.float64) - w for u, w in zip(up, w_t, strict=True)])
            for up in uploads]
