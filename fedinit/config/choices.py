"""The names the run config accepts and the model/image-size rule, free of torch and numpy.

The run config's checks read these tables; ``fedinit.task.models``, ``fedinit.task.partition``
and the strategies use the same ones.
"""

from __future__ import annotations

MODEL_NAMES: tuple[str, ...] = ("cnn", "resnet18-gn", "vgg11")
PARTITION_NAMES: tuple[str, ...] = ("dirichlet", "dirichlet-equal", "iid")
REGIME_KINDS: tuple[str, ...] = ("rotate", "permute-labels")
TRACKINGS: tuple[str, ...] = ("tensorboard", "off")
"""``tracking``: TensorBoard event files under the run directory (server_app/tracking.py)."""
ROUNDS: tuple[str, ...] = ("sync", "async")
"""``rounds``: sync (every round waits for its sampled clients) | async (FedBuff: clients train
at once, every buffer-size replies are aggregated; server_app/async_rounds.py)."""
STALENESS_KINDS: tuple[str, ...] = ("constant", "poly", "hinge")
"""``staleness`` under ``rounds=async`` (fedinit/methods/fedbuff.py: s(tau))."""
TASK_TIMES: tuple[str, ...] = ("steps", "task")
"""``task-time``: a simulated task (``device-speeds``) lasts s_i x its own steps | s_i x the
clients' mean steps (the device's speed alone decides;
``fedinit.config.device_speeds.durations``)."""
STALE_CORRECTIONS: tuple[str, ...] = ("off", "dc")
"""``stale-correction`` under ``rounds=async``: a reply's Delta as computed | delay-compensated
towards the newest model (``fedinit.methods.stale_correction``)."""
REFILLS: tuple[str, ...] = ("random", "balanced")
"""``refill`` under ``rounds=async``: which idle client takes a freed slot: a seeded uniform
choice (FedBuff's) | one of those sent the fewest tasks so far, ties a seeded choice
(``server_app.async_rounds.choose``)."""
SECURE_AGGREGATIONS: tuple[str, ...] = ("off", "secagg+")
"""``secure-aggregation``: off | secagg+ (SecAgg+, ``fedinit/secure_aggregation/``: the server sees
only the round's sum of the clients' clipped, quantised uploads;
``strategies/round_stages/secure_sum.py``)."""
SECAGG_MAX_BITS = 24
"""``secagg-bits`` at most this (``fedinit.secure_aggregation.params.MAX_BITS``; a test holds them
equal)."""
MAX_ROTATIONS = 4
"""Distinct rotations by multiples of 90 degrees: ``rotate`` allows at most this many regimes."""


def check_model_input(name: str, image_size: int) -> None:
    """Raise ValueError when model ``name`` cannot take square images of side ``image_size``."""
    if name == "cnn" and (image_size < 4 or image_size % 4):
        raise ValueError(f"model 'cnn' needs an image side that is a multiple of 4, "
                         f"got {image_size}")
    if name == "vgg11" and image_size != 32:
        raise ValueError(f"model 'vgg11' needs 32x32 images (cifar10, cifar100), "
                         f"got {image_size}x{image_size}")
    if name == "resnet18-gn" and image_size < 28:
        raise ValueError(f"model 'resnet18-gn' needs images of side >= 28, got {image_size}")
