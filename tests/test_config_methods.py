"""The method-specific run-config keys: defaults, registration and one-line errors."""

import dataclasses

import pytest

from strategies.registry import METHOD_NAMES, METHODS
from task.config import ConfigError, RunConfig, load_defaults


def test_every_method_is_registered_under_its_config_name() -> None:
    assert METHOD_NAMES[0] == "fedavg"
    for name in METHOD_NAMES:
        cfg = RunConfig.parse({"method": name})
        assert cfg.method == name and cfg.spec is METHODS[name]
        assert isinstance(cfg.params, METHODS[name].params)


def test_each_method_key_has_one_owner_and_one_default() -> None:
    """Method keys are declared by their method and defaulted in pyproject only: every
    declared key has a default there, and every pyproject key is general or a method's."""
    defaults = set(load_defaults())
    general = {f.name.replace("_", "-") for f in dataclasses.fields(RunConfig)} - {
        "params", "method-values"}
    owned = [key for spec in METHODS.values() for key in spec.params.config_keys()]
    assert len(owned) == len(set(owned)), owned
    assert set(owned) <= defaults
    assert defaults == general | set(owned)


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
