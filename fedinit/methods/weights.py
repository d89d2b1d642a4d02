"""The one array type every layer passes around: a model as a list of numpy arrays, in the
order of the model's parameters (and so of every model-shaped state and upload)."""

import numpy as np

Weights = list[np.ndarray]


def stacked(models: list[Weights], like: Weights) -> Weights:
    """The models' parameters stacked (M, *shape); (0, *shape) for none."""
    if not models:
        return [np.zeros((0, *a.shape), dtype=a.dtype) for a in like]
    return [np.stack([m[i] for m in models]) for i in range(len(like))]


def unstacked(arrays: Weights) -> list[Weights]:
    """The models ``stacked`` holds, in order."""
    count = int(arrays[0].shape[0]) if arrays else 0
    return [[a[m] for a in arrays] for m in range(count)]
