"""A node's ``slowdown`` (``fedinit.node.slowdown``, ``fedinit.node.launch --slowdown``): the
factor's
checks, where it reaches the node config, and that a train task sleeps (FACTOR - 1) x its
measured training time after the reply is built, leaving the reply itself unchanged."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from flwr.common.config import parse_config_args

from client_app.app import train_fn
from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from fedinit.node import slowdown
from fedinit.node.launch import check_slowdown, parse_args, with_slowdown
from tests.test_device_privacy import RUN, context, train_message

PLAIN = {k: v for k, v in RUN.items() if not k.startswith("dp")}
"""A plain run (RUN is under local DP, which withholds compute-seconds)."""


@pytest.mark.parametrize("value", [1, "1", 2.5, "10"])
def test_a_factor_of_at_least_one_is_taken(value: object) -> None:
    assert slowdown.check_factor(value) == float(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0.5, 0, -2, "nan", "inf", "fast", True, None])
def test_anything_else_is_refused_in_one_line_naming_it(value: object) -> None:
    with pytest.raises(slowdown.SlowdownError, match=r"^slowdown .* is not allowed; allowed: "
                                                     r"a number >= 1 \(1: the node's real "
                                                     r"speed\)$"):
        slowdown.check_factor(value)


def test_stretch_sleeps_factor_minus_one_times_the_training_time() -> None:
    slept: list[float] = []
    assert slowdown.stretch(10.0, 0.3, slept.append) == pytest.approx(2.7)
    assert slept == [pytest.approx(2.7)]
    slowdown.stretch(1.0, 0.3, slept.append)  # factor 1: the node's own speed, no sleep
    assert len(slept) == 1
    assert slowdown.factor_of({"partition-id": 0}) == 1.0


def test_the_launcher_flag_lands_in_the_node_config_and_a_bad_one_stops_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    args, node = parse_args(["--slowdown", "10", "--", "--node-config", 'partition-id=2 '
                             'state-dir="/a b"'])
    assert args.slowdown == 10.0
    got = with_slowdown(node, args.slowdown)
    assert parse_config_args([got[-1]]) == {"partition-id": 2, "state-dir": "/a b",
                                            "slowdown": 10.0}
    assert with_slowdown(["--node-config=partition-id=0"], 2.0) == [
        "--node-config=partition-id=0 slowdown=2.0"]
    assert with_slowdown(["--insecure"], 3.0) == ["--insecure", "--node-config",
                                                  "slowdown=3.0"]
    assert with_slowdown(["--insecure"], None) == ["--insecure"]  # default: unchanged
    with pytest.raises(SystemExit, match="both given"):
        with_slowdown(["--node-config", "partition-id=0 slowdown=2"], 3.0)
    with pytest.raises(SystemExit):
        parse_args(["--slowdown", "0.5"])
    assert "--slowdown '0.5' is not allowed; allowed: a number >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"node config slowdown 0\.2 is not allowed"):
        check_slowdown(["--node-config", "partition-id=0 slowdown=0.2"])


def test_a_slow_nodes_train_task_sleeps_after_its_reply_is_built(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Same reply bit for bit at factor 1 and 4; at 4 one sleep of 3 x the reply's
    compute-seconds (the real training time), after training."""
    cfg = RunConfig.parse(PLAIN)
    plain = train_fn(train_message(cfg), context(tmp_path / "a", PLAIN))
    events: list[tuple[str, float]] = []
    real_round = slowdown.stretch

    def watched(factor: float, seconds: float, sleep: object = None) -> float:
        events.append(("stretch", seconds))
        return real_round(factor, seconds, lambda s: events.append(("sleep", s)))

    monkeypatch.setattr(slowdown, "stretch", watched)
    slow = train_fn(train_message(cfg), context(tmp_path / "b", PLAIN, slowdown=4.0))
    compute = float(slow.content.metric_records[rk.METRICS][rk.COMPUTE_SECONDS])
    assert compute > 0
    assert events == [("stretch", compute), ("sleep", pytest.approx(3 * compute))]
    for a, b in zip(unpack(plain.content.array_records[rk.ARRAYS]),
                    unpack(slow.content.array_records[rk.ARRAYS]), strict=True):
        np.testing.assert_array_equal(a, b)
    # under local DP the reply withholds compute-seconds; the node still measures them
    events.clear()
    private = train_fn(train_message(RunConfig.parse(RUN)),
                       context(tmp_path / "c", RUN, slowdown=2.0))
    assert rk.COMPUTE_SECONDS not in private.content.metric_records[rk.METRICS]
    assert events[0][1] > 0 and events[1] == ("sleep", pytest.approx(events[0][1]))


def test_the_task_really_takes_factor_times_its_training(tmp_path: Path) -> None:
    cfg = RunConfig.parse(PLAIN)
    train_fn(train_message(cfg), context(tmp_path / "warm", PLAIN))  # data and model cached
    t0 = time.perf_counter()
    reply = train_fn(train_message(cfg, 2), context(tmp_path / "s", PLAIN, slowdown=3.0))
    wall = time.perf_counter() - t0
    compute = float(reply.content.metric_records[rk.METRICS][rk.COMPUTE_SECONDS])
    assert wall >= 3 * compute


def test_a_bad_node_config_factor_fails_the_task_before_any_work(tmp_path: Path) -> None:
    cfg = RunConfig.parse(PLAIN)
    with pytest.raises(slowdown.SlowdownError, match="slowdown 'x' is not allowed"):
        train_fn(train_message(cfg), context(tmp_path, PLAIN, slowdown="x"))
    assert not any(tmp_path.rglob("*.npz"))  # no state was written
