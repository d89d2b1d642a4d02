"""The method-specific run-config keys: defaults, registration and one-line errors."""

import pytest

from strategies.registry import METHOD_NAMES, METHODS
from task.config import ConfigError, RunConfig


def test_every_method_is_registered_under_its_config_name() -> None:
    assert tuple(METHODS) == METHOD_NAMES and METHOD_NAMES[0] == "fedavg"
    for name in METHOD_NAMES:
        assert RunConfig.parse({"method": name}).method == name


def test_defaults_follow_the_authors_code() -> None:
    c = RunConfig.parse({}).to_dict()
    assert [c[k] for k in ("feddyn-alpha", "prox-mu", "fedcm-alpha", "sam-rho")] == [0.1] * 4
    assert [c[k] for k in ("adam-beta1", "adam-beta2", "adam-eps")] == [0.9, 0.99, 0.01]
    assert RunConfig.parse({"method": "feddyn"}).params.feddyn_alpha == 0.1  # type: ignore[attr-defined]


GOOD = [("prox-mu", 0.0), ("sam-rho", 0.0), ("adam-beta1", 0.0), ("fedcm-alpha", 1.0),
        ("feddyn-alpha", 2)]


@pytest.mark.parametrize(("key", "value"), GOOD)
def test_edge_values_are_accepted(key: str, value: object) -> None:
    assert RunConfig.parse({key: value}).to_dict()[key] == value


BAD = [
    ("method", "fednope", "scaffold"),
    ("feddyn-alpha", 0.0, "> 0"),
    ("feddyn-alpha", -0.1, "> 0"),
    ("prox-mu", -0.01, ">= 0"),
    ("adam-beta1", 1.0, "0 <= adam-beta1 < 1"),
    ("adam-beta1", -0.1, "0 <= adam-beta1 < 1"),
    ("adam-beta2", 1.5, "0 <= adam-beta2 < 1"),
    ("adam-eps", 0.0, "> 0"),
    ("fedcm-alpha", 0.0, "0 < fedcm-alpha <= 1"),
    ("fedcm-alpha", 1.1, "0 < fedcm-alpha <= 1"),
    ("sam-rho", -1.0, ">= 0"),
    ("sam-rho", "0.1", "expected float"),
]


@pytest.mark.parametrize(("key", "value", "allowed"), BAD)
def test_bad_value_names_key_value_and_allowed(key: str, value: object, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        RunConfig.parse({key: value})
    msg = str(err.value)
    assert "\n" not in msg
    assert f"{key}=" in msg and repr(value) in msg and allowed in msg
