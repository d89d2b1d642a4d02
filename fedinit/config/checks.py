"""The order the checks run in, which is part of the contract: for a config with several bad
values the first failing check is the one line the user sees (``tests/test_config*.py`` pin
many). Each group module owns the checks of its own keys, ``cross.py`` those between groups;
the one-line tables below (choices, positive numbers) list keys of several groups in the order
a reader would look for them."""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fedinit.config import cross, data, evaluation, fleet, privacy, robust, schedule, train
from fedinit.config.choices import (
    MODEL_NAMES,
    PARTITION_NAMES,
    REFILLS,
    REGIME_KINDS,
    ROUNDS,
    SECURE_AGGREGATIONS,
    STALE_CORRECTIONS,
    STALENESS_KINDS,
    TASK_TIMES,
    TRACKINGS,
)
from fedinit.config.defaults import load_defaults
from fedinit.config.errors import ConfigError, bad_value, did_you_mean
from fedinit.data_sets import DATASET_NAMES
from fedinit.methods.registry import AGGREGATIONS, METHOD_NAMES, RI_AGGREGATIONS, WEIGHTINGS

if TYPE_CHECKING:  # annotations only: run_config imports these checks
    from fedinit.config.run_config import RunConfig


def check_all(c: RunConfig, *, sized: bool = True) -> None:
    """Every check of ``RunConfig.parse`` but the method's own parameters, in order. Not
    ``sized`` (a strategy's constructor, before it has seen the federation): ``num-clients``
    is a stand-in, so every check that reads the client count or the round size waits for the
    parse that has them (``start()``)."""
    _check_finite(c)
    _check_ranges(c, sized)
    if sized:
        check_examples(c)


def _refuse_any(values: Mapping[str, float], bad: Callable[[float], bool], allowed: str) -> None:
    """The first of ``values`` (key -> value) that is ``bad``, refused as ``allowed`` says:
    one bound shared by a group of keys, checked in their order."""
    for key, value in values.items():
        if bad(value):
            raise bad_value(key, value, allowed)


def _check_finite(c: RunConfig) -> None:
    """NaN and infinities pass every range test below (NaN compares False), so refuse them
    first, for every float key at once; a NaN left in the run config would also break
    Flower's simulation engine, which compares run configs with ``==``."""
    for key, value in c.to_dict().items():
        if isinstance(value, float) and not math.isfinite(value):
            raise bad_value(key, value, "a finite number")


def check_examples(c: RunConfig, available: int | None = None) -> None:
    """Every client needs at least one training example; ``available`` is the data set's
    training-set size once it is loaded (None before), since a partition cannot be smaller."""
    if 0 < c.data.train_limit < c.num_clients:
        raise bad_value("train-limit", c.data.train_limit,
                        f"0 (all) or at least num-clients={c.num_clients} examples")
    if available is not None and available < c.num_clients:
        raise bad_value("num-clients", c.num_clients, f"at most the {available} training "
                        f"examples of dataset={c.data.dataset!r}")


def check_writable(key: str, path: Path) -> None:
    """Create ``path`` and write a probe file in it, so that a run whose results cannot be
    saved fails before any work, naming the key, not with a traceback after round 1."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        raise ConfigError(f"run config: {key}={str(path)!r} is not a writable directory: "
                          f"{err.strerror or err}") from None


def _check_choices(c: RunConfig) -> None:
    """Every key with a fixed set of names (``dp``'s are checked with DP's keys)."""
    t, d, f = c.train, c.data, c.fleet
    choices = {
        "method": (c.method, METHOD_NAMES),
        "ri-aggregation": (t.ri_aggregation, RI_AGGREGATIONS),
        "weighting": (t.weighting, WEIGHTINGS),
        "aggregation": (c.robust.aggregation, AGGREGATIONS),
        "dataset": (d.dataset, DATASET_NAMES),
        "partition": (d.partition, PARTITION_NAMES),
        "regime-kind": (d.regime_kind, REGIME_KINDS),
        "model": (t.model, MODEL_NAMES),
        "simulation-client-state": (f.simulation_client_state, ("disk", "memory")),
        "evaluation": (c.eval.evaluation, evaluation.EVALUATIONS),
        "tracking": (f.tracking, TRACKINGS),
        "rounds": (c.schedule.rounds, ROUNDS),
        "staleness": (c.schedule.staleness, STALENESS_KINDS),
        "stale-correction": (c.schedule.stale_correction, STALE_CORRECTIONS),
        "refill": (c.schedule.refill, REFILLS),
        "task-time": (c.schedule.task_time, TASK_TIMES),
        "secure-aggregation": (c.privacy.secure_aggregation, SECURE_AGGREGATIONS),
    }
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise ConfigError(f"run config: {key}={value!r} is not allowed"
                              f"{did_you_mean(value, allowed)}; allowed: {' | '.join(allowed)}")


def _check_ranges(c: RunConfig, sized: bool) -> None:
    """Range checks, one per key, in the order a reader would look for them; those that read
    the client count or the round size only when ``sized``."""
    n = c.num_clients if sized else None
    t, d, e, f, r = c.train, c.data, c.eval, c.fleet, c.robust
    _check_choices(c)
    if d.on_devices:
        data.check_device_schema(d)
        cross.check_device_cap(c)
    cross.check_model_fits(c)
    train.check_beta_fraction(t)
    _refuse_any({"num-server-rounds": t.num_server_rounds, "num-clients": c.num_clients,
                 "local-epochs": t.local_epochs, "batch-size": t.batch_size,
                 "eval-every": e.eval_every, "min-replies": f.min_replies,
                 "max-failed-rounds": f.max_failed_rounds},
                lambda v: v < 1, "an integer >= 1")
    _refuse_any({"lr": t.lr, "dirichlet-alpha": d.dirichlet_alpha,
                 "round-timeout": f.round_timeout, "node-wait-timeout": f.node_wait_timeout},
                lambda v: not v > 0.0, "a number > 0")
    train.check_server_lr_decay(t)
    robust.check_trim_fraction(r)
    robust.check_byzantine_f(r)
    cross.check_robust(c, sized)
    cross.check_per_client(c)
    fleet.check_min_clients(f, n)
    if sized:
        cross.check_min_replies(c)
    _refuse_any({"max-examples-per-client": r.max_examples_per_client,
                 "weight-decay": t.weight_decay, "clip-norm": t.clip_norm,
                 "channel-noise": d.channel_noise, "brightness-noise": d.brightness_noise,
                 "train-limit": d.train_limit},
                lambda v: v < 0, "a number >= 0 (0 disables it)")
    fleet.check_task_deadline(f)
    robust.check_norm_ratio(r)
    data.check_local_test_fraction(d)
    data.check_regimes(d, n)
    evaluation.check_counts(e)
    cross.check_personal_needs_split(c)
    evaluation.check_federated_clients(e)
    cross.check_evaluation(c)
    privacy.check_dp_keys(c.privacy)
    cross.check_dp_refusal(c)
    privacy.check_distributed_needs_secagg(c.privacy)
    schedule.check_async_keys(c.schedule, n)
    schedule.check_lr_scale(c.schedule, c.fleet.resume_dir)
    train.check_server_momentum(c.train, c.method)
    cross.check_async(c, sized)
    privacy.check_secagg_keys(c.privacy)
    # before check_secagg: it reads the codec's bits (RunConfig.secagg_bits)
    train.check_compression(t, c.privacy.secure_aggregation, c.privacy.secagg_bits,
                            int(load_defaults()["secagg-bits"]))
    cross.check_secagg(c, sized)
    fleet.check_over_select_value(f)
    cross.check_over_select(c, sized)
    if c.schedule.device_speeds != "off":  # its parser (and numpy's draws) only when set
        from fedinit.config.device_speeds import parse_speeds

        parse_speeds(c.schedule.device_speeds)
    cross.check_speeds_on_devices(c)
    if c.seed < 0:
        raise bad_value("seed", c.seed, "an integer >= 0")
    fleet.check_output_dir(f)
