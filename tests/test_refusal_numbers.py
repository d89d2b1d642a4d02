"""A refusal's numbers read as true as the comparison it states (``fedinit.config.shown``).

A run asking for noise 0.9999999 of a device whose floor is 1 was refused with
``dp-noise-multiplier=1 < this device's dp-min-noise=1``: rounded until the line read false.
Each test drives the real refusal and checks the printed numbers compare as the line says.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

from client_app.app import train_fn
from client_app.model_cache import initial_weights
from fedinit.cli.inprocess_grid import set_task_identity
from fedinit.config import ConfigError, RunConfig
from fedinit.config.shown import shown
from fedinit.methods import wire as rk
from fedinit.methods.dp import min_secagg_clip
from strategies.device_privacy import REFUSED

RUN: dict[str, Any] = {"num-clients": 4, "train-limit": 400, "batch-size": 50,
                       "local-epochs": 1, "dp": "local", "dp-clip": 0.5, "weighting": "uniform",
                       "dp-noise-multiplier": 1.2, "output-dir": "/tmp/unused"}
FLOOR = {"dp-floor": "local", "dp-max-clip": 1.0, "dp-min-noise": 1.0}
NUMBER = r"([0-9.e+-]+)"


def refused_train(run: dict[str, Any], tmp_path: Path) -> str:
    """The reason of the device's refusal of one train message of ``run``."""
    set_task_identity()
    cfg = RunConfig.parse(run)
    conf = {rk.ROUND: 1, rk.LR: 0.05, rk.BETA: 0.0, rk.UPLOAD_DELTA: True,
            rk.EXPERIMENT: "exp", rk.CLIENT_ID: 1}
    msg = Message(content=RecordDict({rk.ARRAYS: ArrayRecord(list(initial_weights(cfg))),
                                      rk.CONFIG: ConfigRecord(conf)}),
                  dst_node_id=7, message_type=MessageType.TRAIN)
    ctx = Context(run_id=1, node_id=7, state=RecordDict(), run_config=dict(run),
                  node_config={"partition-id": 1, "num-partitions": 4, **FLOOR,
                               "state-dir": str(tmp_path)})
    reply = train_fn(msg, ctx)
    assert reply.has_error() and reply.error.code == REFUSED
    return reply.error.reason


def test_noise_just_below_the_floor_reads_below_it(tmp_path: Path) -> None:
    reason = refused_train({**RUN, "dp-noise-multiplier": 0.9999999}, tmp_path)
    assert reason.endswith("run config dp-noise-multiplier=0.9999999 < this device's "
                           "dp-min-noise=1")


def test_a_clip_just_above_the_floor_reads_above_it(tmp_path: Path) -> None:
    reason = refused_train({**RUN, "dp-clip": 1.0000001}, tmp_path)
    match = re.search(rf"dp-clip={NUMBER} > this device's dp-max-clip={NUMBER}$", reason)
    assert match is not None, reason
    assert float(match.group(1)) > float(match.group(2))


def test_distributed_noise_just_below_the_floor_reads_below_it(tmp_path: Path) -> None:
    """z / sqrt(t_min) one part in 10^8 below the floor: it used to print at 4 digits."""
    run = {**RUN, "dp": "distributed", "secure-aggregation": "secagg+", "min-replies": 4,
           "fraction-train": 1.0, "personal-eval-every": 0, "max-update-norm-ratio": 0.0,
           "dp-noise-multiplier": 2.0 * (1 - 1e-8), "secagg-clip": 100.0}
    reason = refused_train(run, tmp_path)
    match = re.search(rf"= {NUMBER} < this device's dp-min-noise={NUMBER}$", reason)
    assert match is not None, reason
    assert float(match.group(1)) < float(match.group(2))


def test_a_secagg_clip_just_below_its_bound_reads_below_it() -> None:
    base = {"secure-aggregation": "secagg+", "weighting": "uniform", "personal-eval-every": 0,
            "max-update-norm-ratio": 0.0, "dp": "distributed", "min-replies": 3}
    low = min_secagg_clip(RunConfig.parse({**base, "secagg-clip": 1e3}).privacy.dp_clip,
                          RunConfig.parse({**base, "secagg-clip": 1e3}).privacy
                          .dp_noise_multiplier, 3)
    value = low * (1 - 1e-7)
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({**base, "secagg-clip": value})
    match = re.search(rf"secagg-clip={NUMBER} is not allowed; allowed: >= {NUMBER} ",
                      str(err.value))
    assert match is not None, str(err.value)
    assert float(match.group(1)) < float(match.group(2))


@pytest.mark.parametrize(("values", "texts"), [
    ((0.9999999, 1.0), ("0.9999999", "1")),
    ((1.2, 1.0), ("1.2", "1")),
    ((2.0, 2.0), ("2", "2")),  # equal values read equal
    ((1 + 2 ** -52, 1.0), ("1.0000000000000002", "1")),
])
def test_shown_keeps_distinct_values_apart_and_short(values: tuple[float, ...],
                                                     texts: tuple[str, ...]) -> None:
    assert shown(*values) == texts


def test_shown_of_nan_and_inf() -> None:
    assert shown(math.nan, 1.0, math.inf) == ("nan", "1", "inf")
