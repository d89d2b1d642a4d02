"""The names the run config accepts and the model/image-size rule, free of torch and numpy.

The config check imports only this module, ``task.data_paths`` and the standard library, so
a bad value fails in milliseconds. ``task.models``, ``task.partition`` and the strategies use
these same tables.
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
"""``staleness`` under ``rounds=async`` (methods/fedbuff.py: s(tau))."""
TASK_TIMES: tuple[str, ...] = ("steps", "task")
"""``task-time``: a simulated task (``device-speeds``) lasts s_i x its own steps | s_i x the
clients' mean steps (the device's speed alone decides; ``task.device_speeds.durations``)."""
STALE_CORRECTIONS: tuple[str, ...] = ("off", "dc")
"""``stale-correction`` under ``rounds=async``: a reply's Delta as computed | delay-compensated
towards the newest model (``methods.stale_correction``)."""
REFILLS: tuple[str, ...] = ("random", "balanced")
"""``refill`` under ``rounds=async``: which idle client takes a freed slot: a seeded uniform
choice (FedBuff's) | one of those sent the fewest tasks so far, ties a seeded choice
(``server_app.async_rounds.choose``)."""
ASYNC_METHODS: tuple[str, ...] = ("fedavg", "fedprox", "fedsam", "ditto", "fedadam",
                                  "scaffold", "fedcm", "fedrelax")
"""Methods ``rounds=async`` runs (fedavg with beta != 0 is FedInit): FedAvg's server rule on
the buffered update, FedAdam's optimiser on it, SCAFFOLD's with each buffered reply's
Delta_c_i added to c once, unweighted, FedCM's momentum d = -D / (K eta) from the buffered
update, or FedRelax's book eq. (128): each task carries m_i of the neighbours' models held at
send time, a flush replaces each buffered client's model (docs/algorithms.md, FedBuff)."""
ASYNC_REFUSALS: dict[str, str] = {
    "feddyn": "its correction H / N, added at every flush, diverges once replies are a version "
              "stale (least squares, 4 of 8 clients a flush: rel. error 5 after 60 flushes, "
              "sync 4e-5; docs/algorithms.md, FedBuff)",
    "clustered": "it re-clusters the replies of one round; a buffer's replies started from "
                 "different versions of each cluster model",
}
"""Why each other method is refused under ``rounds=async`` (one line each)."""
SECURE_AGGREGATIONS: tuple[str, ...] = ("off", "secagg+")
"""``secure-aggregation``: off | secagg+ (SecAgg+, ``secure_aggregation/``: the server sees
only the round's sum of the clients' clipped, quantised uploads;
``server_app/round_stages/secure_sum.py``)."""
SECAGG_MAX_BITS = 24
"""``secagg-bits`` at most this (``secure_aggregation.params.MAX_BITS``; a test holds them
equal)."""
SECAGG_REFUSALS: dict[str, str] = {
    "fedrelax": "the server keeps each client's own model, which needs each upload",
    "clustered": "the server clusters the clients' individual updates",
}
"""Why each method whose server needs more than the round's sum is refused under
``secure-aggregation=secagg+`` (one line each)."""
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
