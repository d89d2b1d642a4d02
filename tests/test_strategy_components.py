"""``strategies/components.py``: the capabilities a strategy takes as constructor arguments.

Each component maps to the run config's keys with the run config's defaults, fails at
construction with one line of its own (a wrong type, or the run config's own check of its
keys, named by its fields), and a strategy refuses what its method's spec refuses, at
construction; checks that need the federation's size wait for ``start()``. The runs
(constructor vs run config, bit for bit) are ``test_strategy_components_runs.py`` (slow).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord

from fedinit.cli.inprocess_grid import InProcessGrid
from fedinit.config import ConfigError, RunConfig, load_defaults
from fedinit.methods.registry import AGGREGATIONS, METHODS
from strategies import FedDyn, FedInit, FedRelax, Scaffold
from strategies.components import (
    AGGREGATION_CLASSES,
    COMPONENTS,
    BufferedAsync,
    CentralDP,
    Component,
    ComponentError,
    DistributedDP,
    Krum,
    LocalDP,
    MultiKrum,
    OverSelect,
    SecAgg,
    SyncRounds,
    TrimmedMean,
    aggregation_named,
)
from strategies.wire import INITIAL

ALL: list[type[Component]] = sorted({c for kinds in COMPONENTS.values() for c in kinds},
                                    key=lambda c: c.__name__)


def one_line(err: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_each_component_maps_to_run_config_keys_with_the_run_configs_defaults(
        cls: type[Component]) -> None:
    defaults = load_defaults()
    if cls.MISSING is not None:  # still a typed object: its keys are the run config's
        keys = {key: getattr(cls, name, None) for name, key in cls.FIELDS.items()}
    else:
        keys = cls().keys()
    assert set(keys) <= set(defaults)
    for name, key in cls.FIELDS.items():
        if cls is OverSelect:  # the run config's 0 is SyncRounds(): its own default, 0.3
            continue
        field = next(f for f in dataclasses.fields(cls) if f.name == name)
        assert field.default == defaults[key], (cls.__name__, name)


@pytest.mark.parametrize(("make", "line"), [
    (lambda: CentralDP(noise_multiplier="1"),
     "CentralDP: noise_multiplier='1' is not allowed; allowed: a number"),
    (lambda: CentralDP(clipping_norm=float("inf")),
     "CentralDP: clipping_norm=inf is not allowed; allowed: a finite number"),
    (lambda: CentralDP(noise_multiplier=0.0),
     "CentralDP: noise_multiplier=0.0 is not allowed; allowed: a number > 0 with CentralDP"),
    (lambda: DistributedDP(clipping_norm=-1.0),
     "DistributedDP: clipping_norm=-1.0 is not allowed; allowed: a number >= 0"),
    (lambda: SecAgg(num_shares=4),
     "SecAgg: num_shares=4 is not allowed; allowed: an odd integer >= 3 (the client plus "
     "(k-1)/2 ring neighbours on each side)"),
    (lambda: SecAgg(bits=True), "SecAgg: bits=True is not allowed; allowed: an integer"),
    (lambda: TrimmedMean(trim_fraction=0.5),
     "TrimmedMean: trim_fraction=0.5 is not allowed; allowed: 0 <= trim_fraction < 0.5"),
    (lambda: Krum(byzantine_f=-1),
     "Krum: byzantine_f=-1 is not allowed; allowed: an integer >= 0"),
    (lambda: MultiKrum(byzantine_f=1.0),
     "MultiKrum: byzantine_f=1.0 is not allowed; allowed: an integer"),
    (lambda: OverSelect(fraction=0.0),
     "OverSelect: fraction=0.0 is not allowed; allowed: a finite number > 0 (0 is "
     "SyncRounds())"),
    (lambda: BufferedAsync(staleness="pol"),
     "BufferedAsync: staleness='pol' is not allowed (did you mean 'poly'?); allowed: "
     "constant | poly | hinge"),
    (lambda: BufferedAsync(refill="fair"),
     "BufferedAsync: refill='fair' is not allowed; allowed: random | balanced"),
    (lambda: BufferedAsync(max_staleness=-2),
     "BufferedAsync: max_staleness=-2 is not allowed; allowed: an integer >= 0 (0 = no "
     "limit)"),
    (lambda: BufferedAsync(concurrency=-1),
     "BufferedAsync: concurrency=-1 is not allowed; allowed: an integer >= 0 (0: the "
     "clients per round), at most the nodes found"),
])
def test_each_component_refuses_a_wrong_value_at_construction_in_one_line(
        make: Any, line: str) -> None:
    with pytest.raises(ComponentError) as err:
        make()
    assert one_line(err) == line


@pytest.mark.parametrize(("make", "keys", "names"), [
    (lambda: CentralDP(clipping_norm=0.0), {"dp": "central", "dp-clip": 0.0,
                                            "weighting": "uniform"},
     {"dp-clip": "clipping_norm", "dp='central'": "CentralDP"}),
    (lambda: SecAgg(threshold=2), {"secagg-threshold": 2},
     {"secagg-threshold": "threshold", "secagg-num-shares": "num_shares"}),
    (lambda: BufferedAsync(staleness_a=-0.5), {"staleness-a": -0.5},
     {"staleness-a": "staleness_a"}),
    (lambda: OverSelect(fraction=-0.1), {"over-select": -0.1}, {"over-select": "fraction"}),
])
def test_a_components_value_error_is_the_run_configs_named_by_its_fields(
        make: Any, keys: dict[str, Any], names: dict[str, str]) -> None:
    """The run config stays the one source of the rules: the component's line is the run
    config's line for the same keys, its keys named by the component's fields."""
    with pytest.raises(ConfigError) as run_config:
        RunConfig.parse(keys)
    want = str(run_config.value).removeprefix("run config: ")
    for key, name in names.items():  # a whole key, not part of a longer word
        want = re.sub(rf"(?<![\w-]){re.escape(key)}(?![\w-])", name, want)
    with pytest.raises(ComponentError) as component:
        make()
    owner = next(n for n in ("CentralDP", "SecAgg", "BufferedAsync", "OverSelect")
                 if one_line(component).startswith(f"{n}: "))
    assert one_line(component) == f"{owner}: {want}"


# ------------------------------------------------------------------ on a strategy
def test_the_string_form_and_the_component_give_the_same_checked_settings() -> None:
    """Every rule of ``AGGREGATION_CLASSES``, its name taken from the class (``FIXED``), the
    fields it has set off their defaults in both forms."""
    off_default: dict[str, Any] = {"byzantine_f": 2, "trim_fraction": 0.2}
    for cls in AGGREGATION_CLASSES:
        name = cls.FIXED["aggregation"]
        component = cls(**{f: v for f, v in off_default.items() if f in cls.FIELDS})
        legacy = FedInit(aggregation=name, **off_default, lr=0.05)
        new = FedInit(aggregation=component, lr=0.05)
        assert legacy.checked.to_dict() == new.checked.to_dict()
        assert new.checked.robust.aggregation == name
    assert [c.FIXED["aggregation"] for c in AGGREGATION_CLASSES] == list(AGGREGATIONS)
    with pytest.raises(ComponentError, match=r"^aggregation: aggregation='krm' is not allowed "
                       r"\(did you mean 'krum'\?\)"):
        aggregation_named("krm")


def test_each_component_reaches_the_run_config_of_the_strategy() -> None:
    strategy = FedInit(lr=0.05, weighting="uniform", min_replies=2,
                       privacy=CentralDP(noise_multiplier=0.7, clipping_norm=0.3),
                       rounds=SyncRounds())
    p = strategy.checked.privacy
    assert (p.dp, p.dp_noise_multiplier, p.dp_clip) == ("central", 0.7, 0.3)
    buffered = FedInit(lr=0.05, fraction_evaluate=0.0, rounds=BufferedAsync(
        buffer_size=4, concurrency=6, staleness="hinge", staleness_b=2.0))
    s = buffered.checked.schedule
    assert (s.rounds, s.buffer_size, s.concurrency, s.staleness, s.staleness_b) == (
        "async", 4, 6, "hinge", 2.0)
    secure = Scaffold(lr=0.05, weighting="uniform", max_update_norm_ratio=0.0,
                      secure_aggregation=SecAgg(num_shares=7, threshold=4))
    q = secure.checked.privacy
    assert (q.secure_aggregation, q.secagg_num_shares, q.secagg_threshold) == ("secagg+", 7, 4)


@pytest.mark.parametrize(("make", "line"), [
    (lambda: FedInit(privacy="central", lr=0.05),
     "FedInit: privacy='central' is not allowed; allowed: None | CentralDP(...) | "
     "DistributedDP(...) | LocalDP(...) (from strategies.components)"),
    (lambda: FedInit(rounds="async", lr=0.05),
     "FedInit: rounds='async' is not allowed; allowed: SyncRounds(...) | OverSelect(...) | "
     "BufferedAsync(...) (from strategies.components)"),
    (lambda: FedInit(aggregation=Krum(), byzantine_f=2, lr=0.05),
     "FedInit: byzantine_f=2 is not allowed with aggregation=Krum(byzantine_f=1); allowed: "
     "the component's own field (e.g. Krum(byzantine_f=1))"),
    (lambda: FedInit(privacy=CentralDP(), lr=0.05),
     "FedInit: weighting='examples' is not allowed; allowed: uniform with privacy (example "
     "counts as weights would let a client's data size scale its influence past the clip "
     "bound)"),
    (lambda: FedInit(rounds=OverSelect(fraction=0.3), lr=0.05),
     "FedInit: fraction_train=1.0 is not allowed; allowed: at most 0.7692 with "
     "rounds=OverSelect(fraction=0.3) (ceil(m (1 + fraction)) of the N nodes are sampled, "
     "m = fraction_train x N)"),
    (lambda: FedInit(rounds=BufferedAsync(), lr=0.05),
     "FedInit: fraction_evaluate=1.0 is not allowed; allowed: 0 with "
     "rounds=BufferedAsync(...) (federated evaluation beside in-flight training is not "
     "built yet; evaluate_fn in start() runs after each flush)"),
])
def test_a_strategy_refuses_a_wrong_capability_in_one_line(make: Any, line: str) -> None:
    with pytest.raises(ConfigError) as err:
        make()
    assert one_line(err) == line


def test_local_dp_asks_for_no_federated_evaluation() -> None:
    with pytest.raises(ConfigError) as err:
        FedInit(privacy=LocalDP(), weighting="uniform", lr=0.05)
    assert one_line(err) == (
        "FedInit: fraction_evaluate=1.0 is not allowed; allowed: 0 with privacy=LocalDP(...) "
        "(under local DP a device answers no exact query about its data; the project's "
        "ClientApp refuses every evaluate message)")
    assert FedInit(privacy=LocalDP(), weighting="uniform", lr=0.05,
                   fraction_evaluate=0.0).checked.privacy.dp == "local"


def test_central_dp_with_krum_is_refused_by_both_doors_with_the_same_line() -> None:
    """The noise is calibrated to the sum of all clipped replies, which a selection of
    them is not: neither front door runs FedInit + central DP + Krum."""
    with pytest.raises(ConfigError) as run_config:
        RunConfig.parse({"dp": "central", "weighting": "uniform", "aggregation": "krum"})
    with pytest.raises(ConfigError) as strategy:
        FedInit(lr=0.05, weighting="uniform", privacy=CentralDP(), aggregation=Krum())
    want = str(run_config.value).removeprefix("run config: ").replace(
        "with dp ", "with privacy ").replace("aggregation='krum'", "aggregation=Krum(...)")
    assert one_line(strategy) == f"FedInit: {want}"


def test_a_line_names_the_component_and_never_the_placeholder_federation() -> None:
    with pytest.raises(ConfigError) as err:
        FedInit(rounds=BufferedAsync(buffer_size=3), aggregation=Krum(), fraction_train=0.5,
                fraction_evaluate=0.0, lr=0.05)
    assert one_line(err) == (
        "FedInit: rounds.buffer_size=3 is not allowed; allowed: at least 5 (0: "
        "rounds.concurrency=the clients per round) with aggregation=Krum(...) and "
        "aggregation.byzantine_f=1 with rounds=BufferedAsync(...) (the rule runs over the K "
        "buffered replies: n > 2f + 2)")


def test_what_a_method_cannot_run_is_refused_by_its_own_spec_at_construction(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spec = METHODS["feddyn"]
    with pytest.raises(ConfigError) as err:
        FedDyn(rounds=BufferedAsync(), fraction_evaluate=0.0, lr=0.05)
    assert one_line(err) == (f"FedDyn: rounds={BufferedAsync().shown()} is not allowed "
                             f"({spec.async_refusal})")
    with pytest.raises(ConfigError, match=re.escape(
            f"FedRelax: secure_aggregation={SecAgg().shown()} is not allowed "
            f"({METHODS['fedrelax'].secagg_refusal})")):
        FedRelax(secure_aggregation=SecAgg(), lr=0.05)
    # the spec decides: cleared, FedDyn takes the rounds; set, FedInit does not
    monkeypatch.setattr("fedinit.methods.feddyn.SPEC",
                        dataclasses.replace(spec, async_refusal=None))
    assert FedDyn(rounds=BufferedAsync(), fraction_evaluate=0.0, lr=0.05).buffered
    monkeypatch.setattr("fedinit.methods.fedavg.SPEC", dataclasses.replace(
        METHODS["fedavg"], secagg_refusal="a reason of the spec's own"))
    with pytest.raises(ConfigError, match=r"\(a reason of the spec's own\)$"):
        FedInit(secure_aggregation=SecAgg(), weighting="uniform", max_update_norm_ratio=0.0,
                lr=0.05)


def test_checks_that_need_the_federations_size_wait_for_start() -> None:
    """At 1,000,000 placeholder clients SecAgg's 16-bit sum would hold too many clients per
    round; the constructor does not say so. At start() the real count decides."""
    settings = {"weighting": "uniform", "max_update_norm_ratio": 0.0, "lr": 0.05,
                "fraction_train": 0.5, "min_available_nodes": 4, "fraction_evaluate": 0.0}
    Scaffold(secure_aggregation=SecAgg(bits=24), **{**settings, "fraction_train": 1.0})
    strategy = Scaffold(secure_aggregation=SecAgg(num_shares=5, threshold=3), **settings)
    raw = RunConfig.parse({"num-clients": 4, "train-limit": 100}).to_dict()
    grid = InProcessGrid(4, raw)
    with pytest.raises(ConfigError) as err:
        strategy.start(grid, ArrayRecord([np.zeros((2, 2), np.float32)]), num_rounds=1)
    assert one_line(err).startswith("Scaffold: secure_aggregation.threshold=3 is not allowed; "
                                    "allowed: at most the clients per round (2)")
    assert grid.sent == []  # before any work


def test_flowers_dp_wrapper_is_refused_naming_the_privacy_argument() -> None:
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping

    from tests.test_strategies import UserGrid

    wrapped = DifferentialPrivacyServerSideFixedClipping(
        FedInit(min_available_nodes=2, fraction_evaluate=0.0, lr=0.05), noise_multiplier=1.0,
        clipping_norm=0.1, num_sampled_clients=2)
    grid = UserGrid([1, 2])
    with pytest.raises(RuntimeError) as caught:
        wrapped.start(grid, ArrayRecord([np.zeros((1, 3), np.float32)]), num_rounds=1)
    line = str(caught.value)
    assert "\n" not in line
    assert "FedInit(privacy=CentralDP(noise_multiplier=..., clipping_norm=...))" in line
    assert grid.sent == [] and grid.trained == []  # refused before its first message


def train_users_app(args: dict[str, Any]) -> tuple[list[Any], Any]:
    """FedInit with ``args`` for 2 rounds over a user's ClientApp (``method_train`` on a
    least-squares model, ``tests/test_strategies.py``'s ``UserGrid``): every round
    aggregates, none of its replies rejected, the model moves and stays finite. Returns
    the rounds' train metrics and the grid."""
    import torch
    from torch import nn

    from tests.test_strategies import D, UserGrid

    torch.manual_seed(0)
    grid = UserGrid([40, 10, 30, 20])
    model = nn.Linear(D, 1, bias=False)
    w0 = model.weight.detach().numpy().copy()
    settings = {"fraction_train": 0.5, "min_train_nodes": 1, "min_available_nodes": 4,
                "fraction_evaluate": 0.0, "lr": 0.05, **args}
    result = FedInit(**settings).start(grid, ArrayRecord(model.state_dict()), num_rounds=2)
    rounds = list(result.train_metrics_clientapp.values())
    assert len(rounds) == 2 and all(m["num-rejected"] == 0 for m in rounds)
    w = result.arrays.to_torch_state_dict()["weight"].numpy()
    assert np.all(np.isfinite(w)) and not np.array_equal(w, w0)
    return rounds, grid


@pytest.mark.parametrize("args", [
    {"aggregation": Krum(byzantine_f=0), "fraction_train": 1.0},
    {"aggregation": TrimmedMean(trim_fraction=0.25), "fraction_train": 1.0},
    {"rounds": OverSelect(fraction=0.5)},
    {"rounds": BufferedAsync(concurrency=3, buffer_size=2)},
], ids=["krum", "trimmed-mean", "over-select", "buffered-async"])
def test_each_capability_trains_a_users_app_through_method_train(args: dict[str, Any]) -> None:
    """``privacy=CentralDP``: ``test_strategy_components_runs.py`` (the accountant's import
    is slow)."""
    rounds, grid = train_users_app(args)
    first: dict[int, Any] = {}  # each node's first train message carried w_0 (RI, beta 0.1)
    for msg in grid.sent:
        first.setdefault(msg.metadata.dst_node_id, msg)
    assert first and all(INITIAL in m.content.array_records for m in first.values())
    if isinstance(args.get("rounds"), OverSelect):
        assert [m["over-selected"] for m in rounds] == [3, 3]
    if isinstance(args.get("rounds"), BufferedAsync):
        assert [m["num-replies"] for m in rounds] == [2, 2]  # one flush of K = 2 each


def test_the_package_gives_every_component_by_name() -> None:
    import strategies

    assert {c.__name__ for c in ALL} == strategies.COMPONENTS
    assert all(getattr(strategies, c.__name__) is c for c in ALL)


def test_a_plain_clientapp_under_buffered_async_stops_naming_method_train() -> None:
    """Every reply of a ClientApp without the client half is rejected; after
    ``stop_after_foreign_rounds`` such replies in a row FedBuff's loop stops in one line."""
    from flwr.app import Message, MessageType, MetricRecord, RecordDict

    from strategies.client_half_check import ClientHalfMissing
    from tests.test_strategies import UserGrid

    class PlainGrid(UserGrid):
        def send_and_receive(self, messages: Any, *, timeout: float | None = None) -> Any:
            return [Message(RecordDict({"arrays": m.content.array_records["arrays"],
                                        "metrics": MetricRecord({"num-examples": 8})}),
                            reply_to=m) if m.metadata.message_type == MessageType.TRAIN
                    else Message(RecordDict(), reply_to=m) for m in messages]

    strategy = FedInit(fraction_train=0.5, min_available_nodes=4, fraction_evaluate=0.0,
                       lr=0.05, rounds=BufferedAsync(concurrency=2, buffer_size=2))
    with pytest.raises(ClientHalfMissing) as err:
        strategy.start(PlainGrid([1, 2, 3, 4]), ArrayRecord([np.zeros((1, 3), np.float32)]),
                       num_rounds=2)
    line = str(err.value)
    assert "\n" not in line and line.startswith("FedInit: every reply of ")
    assert "strategies.client.method_train" in line
