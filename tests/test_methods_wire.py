"""Bytes per client per round in each direction, measured on the messages that are sent.

A 2000-parameter linear model makes the model records dominate; round 2 is measured (in round
1 a zero control variate may coincide with other zero arrays and be deduplicated by Flower's
content addressing). The config and metric records are the same for every method:
down: server-round, lr, beta; up: num-examples, train-loss, num-steps.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from flwr.app import RecordDict

from testbeds.lsq_problem import (
    Federation,
    Problem,
    array_bytes,
    lsq_problem,
    record_bytes,
    serialized_bytes,
)

CASES: dict[str, tuple[dict[str, Any], int, int]] = {
    # name: (run config, model-sized records down, up)
    "fedavg": ({"method": "fedavg", "beta": 0.0}, 1, 1),
    "fedinit": ({"method": "fedavg", "beta": 0.1}, 1, 1),
    "fedinit-update": ({"method": "fedavg", "beta": 0.1, "ri-aggregation": "update"}, 1, 1),
    "fedprox": ({"method": "fedprox"}, 1, 1),
    "fedadam": ({"method": "fedadam"}, 1, 1),
    "scaffold": ({"method": "scaffold"}, 2, 2),
    "scaffold+ri": ({"method": "scaffold", "beta": 0.1}, 2, 2),
    "feddyn": ({"method": "feddyn"}, 1, 1),
    "feddyn+ri": ({"method": "feddyn", "beta": 0.1, "ri-aggregation": "update"}, 1, 1),
    "fedcm": ({"method": "fedcm"}, 2, 1),
    "fedsam": ({"method": "fedsam"}, 1, 1),
}


@functools.cache
def problem() -> Problem:
    return lsq_problem(num_clients=4, dim=2000, n=4, seed=1)


def other_bytes(content: RecordDict) -> int:
    """Bytes of the config and metric records (names included)."""
    return record_bytes(content) - sum(len(k) + r.count_bytes()
                                       for k, r in content.array_records.items())


@functools.cache
def measured(name: str) -> dict[str, tuple[int, int]]:
    """{measure: (down, up)} bytes of one client in round 2, the same for every client."""
    f = Federation(problem(), {"fraction-train": 0.5, "batch-size": 4, "lr": 0.01,
                               **CASES[name][0]})
    f.step()
    f.step()
    out = {}
    for label, fn in (("arrays", array_bytes), ("other", other_bytes),
                      ("records", record_bytes), ("serialized", serialized_bytes)):
        down = {fn(m.content) for m in f.sent}
        up = {fn(r.content) for r in f.replies}
        assert len(down) == 1 and len(up) == 1, (label, down, up)  # equal for every client
        out[label] = (down.pop(), up.pop())
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_model_sized_records_cost_what_the_method_says(name: str) -> None:
    _, n_down, n_up = CASES[name]
    model_down, model_up = measured("fedavg")["arrays"]
    assert model_down == model_up  # FedAvg: one model each way
    assert measured(name)["arrays"] == (n_down * model_down, n_up * model_up)


@pytest.mark.parametrize("name", ["fedinit", "fedinit-update", "feddyn", "feddyn+ri",
                                  "fedprox", "fedadam", "fedsam"])
def test_same_bytes_as_fedavg_exactly(name: str) -> None:
    # RI costs nothing on the wire; FedDyn's h_i never leaves the client
    assert measured(name) == measured("fedavg")


@pytest.mark.parametrize("name", ["scaffold", "scaffold+ri"])
def test_scaffold_is_twice_fedavg_each_way(name: str) -> None:
    fedavg, scaffold = measured("fedavg"), measured(name)
    model = fedavg["arrays"][0]
    for i in (0, 1):  # down, up
        assert scaffold["arrays"][i] == 2 * model
        # the whole message: FedAvg's plus one model record and its name
        extra = scaffold["records"][i] - fedavg["records"][i]
        assert model < extra <= model + len("scaffold-delta-c")
        extra = scaffold["serialized"][i] - fedavg["serialized"][i]
        assert 0.99 * model <= extra <= 1.1 * model, (extra, model)


def test_config_and_metric_records_are_the_same_for_every_method() -> None:
    # down: server-round, lr, beta, client-id, accounted-round (8 bytes each), upload-delta
    # (1 byte) and names; up: the four metrics and the upload-delta flag saying what the
    # upload holds
    flag = len("upload-delta") + 1
    assert measured("fedavg")["other"] == (
        len("config") + len("server-round") + len("lr") + len("beta") + len("client-id")
        + len("accounted-round") + 5 * 8 + flag,
        len("metrics") + len("num-examples") + len("train-loss") + len("num-steps")
        + len("compute-seconds") + 4 * 8 + len("config") + flag)
    for name in CASES:
        assert measured(name)["other"] == measured("fedavg")["other"]
