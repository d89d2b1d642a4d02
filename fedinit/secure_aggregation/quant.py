"""Clip, quantise and dequantise model-shaped vectors with Flower's ``quantization``."""

from __future__ import annotations

import numpy as np
from flwr.common.secure_aggregation.quantization import dequantize, quantize

from fedinit.secure_aggregation.params import SecAggParams
from fedinit.secure_aggregation.wire import SecAggInputError


def check_vector(vector: list[np.ndarray], sizes: list[int]) -> None:
    """A client's own input: as many arrays as the setup announced, those sizes, all finite."""
    if len(vector) != len(sizes):
        raise SecAggInputError(f"secagg input has {len(vector)} arrays, the round expects "
                               f"{len(sizes)}")
    for index, (arr, size) in enumerate(zip(vector, sizes, strict=True)):
        if np.asarray(arr).size != size:
            raise SecAggInputError(f"secagg input array {index} has {np.asarray(arr).size} "
                                   f"values, the round expects {size}")
        if not np.all(np.isfinite(arr)):
            raise SecAggInputError(f"secagg input array {index} has a non-finite value")


def quantise(vector: list[np.ndarray], params: SecAggParams) -> list[np.ndarray]:
    """Each coordinate clipped to [-clip, clip], then mapped to 0..2^bits (flat int64)."""
    flat = [np.asarray(a, dtype=np.float64).ravel() for a in vector]
    return [q.astype(np.int64) for q in quantize(flat, params.clip, params.target_range)]


def dequantise_sum(total: list[np.ndarray], n: int, params: SecAggParams,
                   shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The float sum of n uploads: Flower's dequantize shifts by -clip once, a sum needs n."""
    floats = dequantize(total, params.clip, params.target_range)
    return [(f - (n - 1) * params.clip).reshape(s) for f, s in zip(floats, shapes, strict=True)]
