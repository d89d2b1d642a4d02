"""Which run-config keys define an experiment, and which a resumed run may change: one table.

Two questions are asked of every key in pyproject ``[tool.flwr.app.config]``:

- *identity*: do two runs that differ in it answer a different question? The sweep
  (``fedinit/cli/sweep_plan.py``) compares finished runs and names cells by the identity keys only.
- *resume may change*: may a run that continues a checkpoint (``resume-dir``) set it
  differently from the run that wrote the checkpoint? ``server_app/experiment.py`` refuses
  every other difference.

Most keys are identity keys that a resume must keep (``EXPERIMENT``). The others are listed in
``SPECIAL`` with the answer to both questions and why. ``tests/test_config_keys.py`` fails when
pyproject gains a key that is in neither, so each new key is classified when it is added.
A method's own keys are identity keys, taken from the method registry (``Params``), so a new
method's keys are classified with it. This module imports only the registry (numpy-only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from fedinit.methods.registry import method_param_keys


class KeyRole(NamedTuple):
    """How a key that is not a plain experiment key is treated, and why."""

    identity: bool
    resume_may_change: bool
    why: str


SPECIAL: dict[str, KeyRole] = {
    # Where things are: a different path holds the same experiment.
    "output-dir": KeyRole(False, True, "where results are written; a resumed run writes into "
                                       "its resume-dir anyway"),
    "tracking": KeyRole(False, True, "which files the rows are also written to (TensorBoard's); "
                                     "the rows are the same"),
    "resume-dir": KeyRole(False, True, "which run to continue; empty in the run that started it"),
    "data-dir": KeyRole(False, True, "where the files of `dataset` are; the data set is named by "
                                     "`dataset` and is the same when moved"),
    "node-registry": KeyRole(False, True, "where the node-id -> partition file is; node ids are "
                                          "new after a SuperLink restart"),
    "client-state-dir": KeyRole(False, False, "where clients keep their state: any path holds "
                                              "the same experiment, but a resumed run must find "
                                              "the state the first run left there"),
    "simulation-client-state": KeyRole(False, False, "where simulated clients keep their state "
                                                     "(files or the simulation process): the "
                                                     "results are bit-identical, but a resumed run "
                                                     "must find the state where the first run "
                                                     "left it"),
    "dp-release-client-metrics": KeyRole(False, True, "which of the clients' figures the public "
                                                      "files carry under DP; every round "
                                                      "computes the same"),
    # How long to wait, when to give up: the rounds that complete are the same experiment.
    "round-timeout": KeyRole(False, True, "how long a round waits for replies"),
    "node-wait-timeout": KeyRole(False, True, "how long the start waits for the SuperNodes"),
    "task-deadline": KeyRole(False, True, "when a node gives up on a task that hangs, as "
                                          "round-timeout is when the server gives up on it"),
    "min-clients": KeyRole(False, True, "how many clients the start waits for; the others join "
                                        "later, and a run with all of them online is the same"),
    "max-failed-rounds": KeyRole(False, True, "when to stop after failed rounds; a finished run "
                                              "did not meet it, and a resume is how to go on"),
    # What the experiment is, yet a continuation may change it.
    "num-server-rounds": KeyRole(True, True, "a 60-round run is not a 100-round one, but a resume "
                                             "may extend a run"),
    "min-replies": KeyRole(True, True, "decides which rounds are aggregated; a resume may lower "
                                       "it to get past nodes that are gone"),
    "dp-target-epsilon": KeyRole(True, True, "decides when the run stops, not what a round "
                                             "computes; a resume may raise it to spend more "
                                             "budget, as num-server-rounds may extend a run"),
}

EXPERIMENT: frozenset[str] = method_param_keys() | frozenset({
    # the method and what every method has (its own parameters come from the registry)
    "method", "beta", "ri-aggregation", "weighting", "server-lr",
    # the federation and local training
    "num-clients", "fraction-train", "local-epochs", "batch-size", "lr", "lr-decay",
    "weight-decay", "clip-norm", "model", "seed", "eval-every", "evaluation",
    "federated-eval-clients", "divergence-every", "divergence-clients",
    "personal-eval-every", "personal-eval-clients", "finetune-epochs",
    # the data
    "dataset", "partition", "dirichlet-alpha", "channel-noise", "brightness-noise", "train-limit",
    "num-regimes", "regime-kind", "local-test-fraction", "device-classes", "device-image-size",
    "device-channels", "device-mean", "device-std",
    # the server's defences: they change which replies are aggregated and how
    "aggregation", "trim-fraction", "byzantine-f", "max-update-norm-ratio",
    "max-examples-per-client",
    # over-selection: which replies a sync round aggregates (the first m accepted)
    "over-select",
    # asynchronous rounds (FedBuff): when and how replies are aggregated
    "rounds", "concurrency", "buffer-size", "staleness", "staleness-a", "staleness-b",
    "max-staleness", "stale-correction", "dc-lambda", "refill", "server-momentum",
    "async-lr-scale",
    # the virtual clock: which replies over-select and async aggregate, and in what order
    "device-speeds", "task-time",
    # differential privacy: what is clipped and how much noise is added
    "dp", "dp-clip", "dp-clip-extra", "dp-noise-multiplier", "dp-delta",
    # secure aggregation: the sum is of clipped, quantised uploads, and who may drop
    "secure-aggregation", "secagg-num-shares", "secagg-threshold", "secagg-clip", "secagg-bits",
    # compressed uploads: what the server aggregates is the decoded (lossy) upload
    "compression",
})
"""Identity keys that a resume must keep: they decide what is computed."""

NOT_IDENTITY: frozenset[str] = frozenset(k for k, r in SPECIAL.items() if not r.identity)
"""Keys two runs of the same experiment (one sweep cell) may differ in."""

RESUME_MAY_CHANGE: frozenset[str] = frozenset(
    k for k, r in SPECIAL.items() if r.resume_may_change)
"""Keys a resumed run may set differently from the checkpoint's config."""

BEFORE_KEY: dict[str, object] = {
    "local-test-fraction": 0.0,
    "personal-eval-every": 0,
    "cluster-assign": "kmeans",
    "cluster-warmup": 1,
    "cluster-margin": 0.0,
    "cluster-newcomer": "loss",
}
"""Keys added after runs were made whose default differs from what those runs did: the value a
run config without the key means (before ``local-test-fraction`` clients trained on their whole
partition, and nothing evaluated them; before ``cluster-assign`` clustered FL assigned by
k-means; before ``cluster-warmup``, ``cluster-margin`` and ``cluster-newcomer`` its
``loss`` rule clustered round 1's clients alone, and every client took the lowest loss). The
sweep's cell matching and the resume check read a
missing key as this, not as today's default."""


BEFORE_KEY_ONLY_FOR: dict[str, tuple[str, object]] = {
    "cluster-assign": ("method", "clustered"),
    "cluster-warmup": ("method", "clustered"),
    "cluster-margin": ("method", "clustered"),
    "cluster-newcomer": ("method", "clustered"),
}
"""BEFORE_KEY entries that hold only for runs of one setting (a key of one method): any other
run never read the key, so it ran with whatever today's default is."""


def value_before(key: str, default: object,
                 run_config: Mapping[str, object] | None = None) -> object:
    """What a run config (``run_config``, the old run's) that lacks ``key`` ran with."""
    only = BEFORE_KEY_ONLY_FOR.get(key)
    if only is not None and (run_config is None or run_config.get(only[0]) != only[1]):
        return default
    return BEFORE_KEY.get(key, default)
