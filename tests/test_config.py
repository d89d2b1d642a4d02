"""Every bad run-config value fails before any work, with one line naming the key."""

import re
from pathlib import Path

import pytest

from fedinit.config import (
    ConfigError,
    RunConfig,
    check_examples,
    check_writable,
    load_defaults,
)


def test_defaults_parse_to_the_default_experiment() -> None:
    cfg = RunConfig.parse({})
    assert cfg.method == "fedavg" and cfg.train.beta == 0.1 and cfg.data.dataset == "fashion-mnist"
    assert cfg.num_clients == 100 and cfg.clients_per_round == 10
    assert cfg.to_dict() == {**load_defaults(), **cfg.to_dict()}
    assert set(cfg.to_dict()) == set(load_defaults())


@pytest.mark.parametrize(("method", "resolved"), [
    ("fedavg", "model"), ("fedprox", "model"), ("fedsam", "model"), ("scaffold", "model"),
    ("fedadam", "update"), ("fedcm", "update"), ("feddyn", "update"),
])
def test_ri_aggregation_auto_resolves_per_method(method: str, resolved: str) -> None:
    assert RunConfig.parse({"method": method}).train.ri_aggregation == resolved
    for explicit in ("model", "update"):  # an explicit choice always wins
        cfg = RunConfig.parse({"method": method, "ri-aggregation": explicit})
        assert cfg.train.ri_aggregation == explicit


def test_server_lr_zero_is_the_methods_default() -> None:
    assert RunConfig.parse({"method": "fedadam"}).train.server_lr == 0.1
    assert RunConfig.parse({"method": "fedavg"}).train.server_lr == 1.0
    assert RunConfig.parse({"method": "fedadam", "server-lr": 0.5}).train.server_lr == 0.5


def test_int_is_accepted_for_a_float_key() -> None:
    assert RunConfig.parse({"beta": 0}).train.beta == 0.0


def test_lr_schedule() -> None:
    cfg = RunConfig.parse({"lr": 0.1, "lr-decay": 0.5})
    assert cfg.train.lr_at(1) == 0.1 and cfg.train.lr_at(3) == pytest.approx(0.025)


BAD = [
    ("method", "fedfoo", "fedavg"),
    ("beta", 1.0, "-1 < beta < 1"),
    ("beta", -1.5, "-1 < beta < 1"),
    ("ri-aggregation", "both", "auto | model | update"),
    ("weighting", "size", "examples | uniform"),
    ("model", "vgg11", "needs 32x32 images"),  # with the default dataset, fashion-mnist
    ("fraction-train", 0.0, "0 < fraction-train <= 1"),
    ("fraction-train", 1.5, "0 < fraction-train <= 1"),
    ("num-clients", 0, ">= 1"),
    ("num-server-rounds", -3, ">= 1"),
    ("local-epochs", 0, ">= 1"),
    ("batch-size", 0, ">= 1"),
    ("lr", 0.0, "> 0"),
    ("server-lr", -1.0, "> 0, or 0 for the method's default"),
    ("lr-decay", 1.5, "0 < lr-decay <= 1"),
    ("weight-decay", -0.1, ">= 0"),
    ("clip-norm", -1.0, ">= 0"),
    ("dataset", "mnist", "fashion-mnist"),
    ("partition", "pathological", "dirichlet"),
    ("dirichlet-alpha", 0.0, "> 0"),
    ("model", "resnet50", "cnn"),
    ("seed", -1, ">= 0"),
    ("eval-every", 0, ">= 1"),
    ("output-dir", "", "non-empty"),
    ("round-timeout", 0.0, "> 0"),
    ("batch-size", "32", "expected int"),
    ("beta", True, "expected float"),
]


def one_line_refusal(raw: dict[str, object]) -> str:
    """The error ``RunConfig.parse(raw)`` must raise, checked to be one line."""
    with pytest.raises(ConfigError) as err:
        RunConfig.parse(raw)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(("key", "value", "allowed"), BAD)
def test_bad_value_names_key_value_and_allowed(key: str, value: object, allowed: str) -> None:
    msg = one_line_refusal({key: value})
    assert f"{key}=" in msg and repr(value) in msg and allowed in msg


def test_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown key 'betta'"):
        RunConfig.parse({"betta": 0.1})


NON_FINITE = [("lr", float("inf")), ("clip-norm", float("nan")), ("weight-decay", float("nan")),
              ("server-lr", float("nan")), ("max-update-norm-ratio", float("nan")),
              ("dirichlet-alpha", float("inf")), ("beta", float("-inf"))]


@pytest.mark.parametrize(("key", "value"), NON_FINITE)
def test_non_finite_value_is_one_line_naming_the_key(key: str, value: float) -> None:
    """NaN passes every range test (it compares False); Flower's simulation engine would then
    fail with "The `run_config` field ... cannot be modified" (NaN != NaN), naming no key."""
    msg = one_line_refusal({key: value})
    assert msg == f"run config: {key}={value!r} is not allowed; allowed: a finite number"


def test_every_float_key_refuses_nan() -> None:
    for key, default in load_defaults().items():
        if isinstance(default, float):
            with pytest.raises(ConfigError, match=f"{key}=nan is not allowed"):
                RunConfig.parse({key: float("nan")})


def test_fewer_training_examples_than_clients_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"train-limit=5 is not allowed; allowed: 0 \(all\) "
                       "or at least num-clients=10"):
        RunConfig.parse({"train-limit": 5, "num-clients": 10})
    cfg = RunConfig.parse({"train-limit": 10, "num-clients": 10})
    with pytest.raises(ConfigError, match="num-clients=10 is not allowed; allowed: at most the "
                       "7 training examples"):
        check_examples(cfg, available=7)


def test_unwritable_output_dir_is_one_line_naming_key_and_path(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a regular file: nobody, not even root, can create a directory in it")
    with pytest.raises(ConfigError) as err:
        check_writable("output-dir", blocker / "sub")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"run config: output-dir='{blocker / 'sub'}'")
    check_writable("output-dir", tmp_path / "a" / "b")  # created when it can be


@pytest.mark.parametrize(("raw", "first"), [
    ({"lr": -1.0, "dataset": "x"}, "dataset='x'"),  # names before ranges
    ({"seed": -1, "dp-delta": 2.0}, "dp-delta=2.0"),  # privacy before seed
    ({"concurrency": -1, "trim-fraction": 0.7}, "trim-fraction=0.7"),  # robust before async
    ({"lr": "x", "seed": "y"}, "lr='x'"),  # types in the keys' order
])
def test_across_groups_the_first_bad_key_in_check_order_is_reported(
        raw: dict[str, object], first: str) -> None:
    with pytest.raises(ConfigError, match=f"^run config: {re.escape(first)}"):
        RunConfig.parse(raw)


def test_fields_live_in_their_group_only() -> None:
    cfg = RunConfig.parse({})
    assert cfg.train.lr == load_defaults()["lr"] and cfg.privacy.dp == load_defaults()["dp"]
    assert not hasattr(cfg, "lr") and not hasattr(cfg, "dp")  # no flat alias
