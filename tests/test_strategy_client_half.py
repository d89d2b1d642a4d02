"""A Flower user's misused strategy stops with its fix, before or while it runs.

A fleet of plain Flower ClientApps (no ``method_train``) under a ``strategies`` class: the
run stops after ``stop_after_foreign_rounds`` rounds with one line naming
``strategies.client.method_train`` (it used to end "successfully" with the starting model);
one wrong node among good ones is rejected and named but does not stop the run; a model with
BatchNorm buffers is refused at ``start()`` before any node is asked; FedProx takes Flower's
``proximal_mu``; FedInit's summary names FedInit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from torch import nn

from fedinit.config import ConfigError
from fedinit.methods import wire as rk
from fedinit.methods.packed_arrays import unpack
from strategies import FedDyn, FedInit, FedProx, Scaffold
from strategies.client_half_check import ClientHalfMissing, is_foreign
from tests.flower_log import flower_lines
from tests.test_strategies import D, N, UserGrid

pytestmark = pytest.mark.usefixtures("quick_runs")


class PlainGrid(UserGrid):
    """``UserGrid`` where the nodes in ``plain`` run a plain Flower ClientApp: they train
    nothing of the method and reply ``arrays`` + ``metrics``, as Flower's quickstarts do."""

    def __init__(self, node_ids: Iterable[int], plain: Iterable[int]) -> None:
        super().__init__(node_ids)
        self.plain = set(plain)

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        good = [m for m in messages if m.metadata.dst_node_id not in self.plain
                or m.metadata.message_type != MessageType.TRAIN]
        out = list(super().send_and_receive(good, timeout=timeout))
        for msg in messages:
            if msg.metadata.dst_node_id in self.plain and \
                    msg.metadata.message_type == MessageType.TRAIN:
                arrays = msg.content.array_records[rk.ARRAYS]
                out.append(Message(RecordDict({
                    "arrays": arrays,
                    "metrics": MetricRecord({"num-examples": N, "train_loss": 0.5})}),
                    reply_to=msg))
        return out


@pytest.fixture
def flower_log() -> Iterator[list[str]]:
    """Flower's log lines of the test (its logger does not propagate to pytest's)."""
    with flower_lines(logging.INFO) as lines:
        yield lines


def linear() -> ArrayRecord:
    torch.manual_seed(0)
    return ArrayRecord(nn.Linear(D, 1, bias=False).state_dict())


@pytest.mark.parametrize("cls", [FedInit, Scaffold, FedDyn], ids=lambda c: c.__name__)
def test_a_fleet_of_plain_clientapps_stops_naming_method_train(
        cls: type, flower_log: list[str]) -> None:
    grid = PlainGrid([10, 20, 30, 40], plain=[10, 20, 30, 40])
    strategy = cls(fraction_train=0.5, min_available_nodes=4, fraction_evaluate=0.0, lr=0.05)
    with pytest.raises(ClientHalfMissing) as caught:
        strategy.start(grid, linear(), num_rounds=5)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(f"{cls.__name__}: every reply of rounds 1-2 came from a ClientApp")
    assert "strategies.client.method_train" in line
    warned = [m for m in flower_log if "did not come from strategies.client.method_train" in m]
    assert [m.split(":")[0] for m in warned] == [f"{cls.__name__} round 1",
                                                 f"{cls.__name__} round 2"]


def test_stop_after_one_round_stops_at_round_one() -> None:
    grid = PlainGrid([10, 20], plain=[10, 20])
    strategy = FedInit(min_available_nodes=2, fraction_evaluate=0.0, lr=0.05,
                       stop_after_foreign_rounds=1)
    with pytest.raises(ClientHalfMissing, match=r"every reply of round 1 came"):
        strategy.start(grid, linear(), num_rounds=3)


def test_one_wrong_node_among_good_ones_is_rejected_and_the_run_goes_on(
        flower_log: list[str]) -> None:
    grid = PlainGrid([10, 20, 30, 40], plain=[30])
    before = unpack(linear())[0].copy()
    result = FedInit(fraction_train=1.0, min_available_nodes=4, fraction_evaluate=0.0,
                     lr=0.05).start(grid, linear(), num_rounds=3)
    rounds = list(result.train_metrics_clientapp.values())
    assert [(m[rk.NUM_REPLIES], m[rk.NUM_REJECTED]) for m in rounds] == [(3, 1)] * 3
    assert not np.array_equal(unpack(result.arrays)[0], before)
    warned = [m for m in flower_log if "did not come from strategies.client.method_train" in m]
    assert len(warned) == 3 and all("1 of 4 replies" in m and "[30]" in m for m in warned)


def test_the_client_halfs_reply_is_not_foreign_and_a_plain_one_is() -> None:
    grid = UserGrid([10, 20])
    strategy = FedInit(min_available_nodes=2, fraction_evaluate=0.0, lr=0.05)
    strategy.prepare(grid, linear(), None)
    msgs = list(strategy.configure_train(1, linear(), ConfigRecord(), grid))
    replies = list(grid.send_and_receive(msgs))
    assert [is_foreign(r) for r in replies] == [False, False]
    plain = Message(RecordDict({"arrays": linear(), "metrics": MetricRecord({"n": 1})}),
                    reply_to=msgs[0])
    assert is_foreign(plain)


class NoNodes(UserGrid):
    def get_node_ids(self) -> Iterable[int]:
        raise AssertionError("a node was asked for before the model was checked")


def test_a_model_with_batchnorm_buffers_is_refused_at_start_before_any_node() -> None:
    model = nn.Sequential(nn.Linear(D, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    with pytest.raises(ConfigError) as caught:
        FedInit(lr=0.05).start(NoNodes([1, 2]), ArrayRecord(model.state_dict()), num_rounds=1)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith("FedInit: initial_arrays holds 3 running buffers ('1.running_mean'")
    assert "GroupNorm" in line


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_a_bad_stop_after_is_refused_in_one_line(bad: object) -> None:
    with pytest.raises(ConfigError, match=rf"^FedInit: stop_after_foreign_rounds={bad!r} is "
                                          r"not allowed; allowed: an integer >= 1$"):
        FedInit(stop_after_foreign_rounds=bad)  # type: ignore[arg-type]


def test_fedprox_takes_flowers_proximal_mu() -> None:
    assert FedProx(proximal_mu=0.3).keys["prox-mu"] == 0.3
    with pytest.raises(TypeError, match="mu"):
        FedProx(mu=0.3)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"^FedProx: proximal_mu=-1"):
        FedProx(proximal_mu=-1.0)


def test_fedinit_names_itself_in_the_run_log(flower_log: list[str]) -> None:
    strategy = FedInit(min_available_nodes=2, fraction_evaluate=0.0, lr=0.05)
    strategy.prepare(UserGrid([1, 2]), linear(), None)
    strategy.summary()
    assert any(m.startswith("FedInit: 2 clients") for m in flower_log), flower_log


# ------------------------------------------------------------------ Flower's FedAvg arguments
class MetricGrid(PlainGrid):
    """``PlainGrid`` whose client-half replies also carry a user metric ``acc`` = node / 100
    and whose nodes answer evaluate messages with ``acc`` = node / 1000 over node examples."""

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        messages = list(messages)
        train = [m for m in messages if m.metadata.message_type == MessageType.TRAIN]
        out = list(super().send_and_receive(train, timeout=timeout))
        for reply in out:
            node = reply.metadata.src_node_id
            reply.content.metric_records[rk.METRICS]["acc"] = node / 100
            if node in self.plain:
                reply.content.metric_records["metrics"]["acc"] = 9.0
        for msg in messages:
            if msg.metadata.message_type == MessageType.EVALUATE:
                node = msg.metadata.dst_node_id
                out.append(Message(RecordDict({"metrics": MetricRecord(
                    {"acc": node / 1000, "num-examples": node})}), reply_to=msg))
        return out


def test_every_argument_of_flowers_fedavg_is_taken() -> None:
    import inspect

    from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
    ours = set(inspect.signature(FedInit.__init__).parameters) | set(
        inspect.signature(FedInit.__mro__[2].__init__).parameters)
    flowers = set(inspect.signature(FlowerFedAvg.__init__).parameters)
    assert flowers - ours == set()


def test_the_users_train_metrics_are_averaged_over_the_accepted_replies_only() -> None:
    grid = MetricGrid([10, 20, 30, 40], plain=[30])
    result = FedInit(fraction_train=1.0, min_available_nodes=4, fraction_evaluate=0.0,
                     lr=0.05).start(grid, linear(), num_rounds=2)
    for m in result.train_metrics_clientapp.values():
        # nodes 10, 20, 40 accepted, N examples each: (0.1 + 0.2 + 0.4) / 3; node 30's 9.0
        # (a rejected reply) is not in it
        assert m["acc"] == pytest.approx((0.1 + 0.2 + 0.4) / 3)
        assert (m[rk.NUM_REPLIES], m[rk.NUM_REJECTED]) == (3, 1)


def test_a_users_train_and_evaluate_aggregation_functions_are_called() -> None:
    seen: list[tuple[int, str]] = []

    def count(records: list[RecordDict], key: str) -> MetricRecord:
        seen.append((len(records), key))
        return MetricRecord({"replies-seen": len(records)})

    def best(records: list[RecordDict], key: str) -> MetricRecord:
        return MetricRecord({"best": max(float(r["metrics"]["acc"]) for r in records)})

    grid = MetricGrid([10, 20, 30, 40], plain=[30])
    result = FedInit(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=4,
                     min_evaluate_nodes=4, lr=0.05, train_metrics_aggr_fn=count,
                     evaluate_metrics_aggr_fn=best).start(grid, linear(), num_rounds=2)
    assert seen == [(3, "num-examples"), (3, "num-examples")]
    assert [m["replies-seen"] for m in result.train_metrics_clientapp.values()] == [3, 3]
    assert [m["best"] for m in result.evaluate_metrics_clientapp.values()] == [0.04, 0.04]


def test_flowers_weighted_by_key_weighs_the_evaluate_metrics() -> None:
    grid = MetricGrid([10, 20, 30, 40], plain=[])
    result = FedInit(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=4,
                     min_evaluate_nodes=4, lr=0.05, weighted_by_key="num-examples",
                     ).start(grid, linear(), num_rounds=1)
    want = sum(n * n / 1000 for n in (10, 20, 30, 40)) / 100  # acc weighted by node examples
    assert result.evaluate_metrics_clientapp[1]["acc"] == pytest.approx(want)


@pytest.mark.parametrize(("arg", "value", "allowed"), [
    ("arrayrecord_key", "weights", "'arrays'"), ("configrecord_key", "cfg", "'config'"),
    ("weighted_by_key", "", "a non-empty metric name"),
    ("train_metrics_aggr_fn", 3, "None or a function")])
def test_a_flower_argument_the_client_half_cannot_honour_is_refused(
        arg: str, value: object, allowed: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Scaffold(**{arg: value})
    assert str(caught.value).startswith(f"Scaffold: {arg}={value!r} is not allowed; "
                                        f"allowed: {allowed}")


# ------------------------------------------------------------------ w_0 from the server
def test_the_server_sends_w0_until_a_clients_first_aggregated_reply() -> None:
    """Under RI each train message to a client with accounted round 0 carries the run's w_0
    (and only those): the client half needs no copy of the server's initial model."""
    from fedinit.methods.packed_arrays import unpack as arrays_of
    from strategies.wire import INITIAL

    grid = UserGrid([10, 20, 30, 40])
    strategy = FedInit(fraction_train=0.5, min_available_nodes=4, fraction_evaluate=0.0,
                       lr=0.05)
    w_0 = arrays_of(linear())
    strategy.prepare(grid, linear(), None)
    arrays = linear()
    for server_round in (1, 2, 3):
        msgs = list(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
        for msg in msgs:
            conf = msg.content.config_records[rk.CONFIG]
            first = int(conf[rk.ACCOUNTED_ROUND]) == 0  # type: ignore[arg-type]
            assert (INITIAL in msg.content.array_records) == first
            if first:
                assert np.array_equal(arrays_of(msg.content.array_records[INITIAL])[0], w_0[0])
        arrays, _ = strategy.aggregate_train(server_round, grid.send_and_receive(msgs))
        assert arrays is not None
    assert not np.array_equal(arrays_of(arrays)[0], w_0[0])


def test_without_initial_the_client_half_starts_ri_from_the_servers_w0() -> None:
    """A first participation in round 3: start = w_3 + beta (w_3 - w_0), with the w_0 the
    message carries, computed by hand."""
    from strategies.wire import INITIAL
    from tests.test_strategies import message, node, problem, user_train

    g = np.random.default_rng(5)
    w_0, w_3 = g.normal(size=D), g.normal(size=D)
    msg = message("fedavg", {}, w_3, 3, beta=0.1)
    msg.content.array_records[INITIAL] = ArrayRecord([w_0.reshape(1, D).astype(np.float32)])
    _, seen = user_train(msg, node(), *problem(0), 1)
    w0_32, w3_32 = w_0.astype(np.float32), w_3.astype(np.float32)
    assert np.allclose(seen[0], w3_32 + np.float32(0.1) * (w3_32 - w0_32), atol=1e-6)


def test_an_initial_that_is_not_a_function_is_refused_in_one_line() -> None:
    from tests.test_strategies import message, node, problem, user_train

    with pytest.raises(ValueError, match=r"^initial= a list is not allowed; allowed: None"):
        user_train(message("fedavg", {}, np.zeros(D), 1, beta=0.1), node(), *problem(0), 1,
                   initial=[np.zeros((1, D))])


def test_flowers_dp_wrapper_around_a_strategy_is_refused_in_one_line() -> None:
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

    wrapped = DifferentialPrivacyServerSideFixedClipping(
        FedInit(min_available_nodes=2, fraction_evaluate=0.0, lr=0.05), noise_multiplier=1.0,
        clipping_norm=0.1, num_sampled_clients=2)
    with pytest.raises(RuntimeError) as caught:
        wrapped.start(UserGrid([1, 2]), linear(), num_rounds=1)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith("FedInit: a round ran before FedInit.start()")
    assert "DifferentialPrivacy*FixedClipping" in line and "dp=central" in line
