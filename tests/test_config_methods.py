"""The method-specific run-config keys: defaults, registration and one-line errors."""

import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from fedinit.config import RunConfig, load_defaults
from fedinit.config.run_config import GENERAL_KEYS, GROUPS, ORDER, TOP
from fedinit.methods.registry import HOMES, METHOD_NAMES, METHODS, composes_with_ri
from tests.test_config import one_line_refusal

REPO = Path(__file__).resolve().parents[1]


def test_every_method_is_registered_under_its_config_name() -> None:
    assert METHOD_NAMES[0] == "fedavg"
    for name in METHOD_NAMES:
        cfg = RunConfig.parse({"method": name, **({} if composes_with_ri(name) else {"beta": 0.0})})
        assert cfg.method == name and cfg.spec is METHODS[name]
        assert isinstance(cfg.params, METHODS[name].params)


def test_each_method_key_has_one_owner_and_one_default() -> None:
    """Method keys are declared by their method and defaulted in pyproject only: every
    declared key has a default there, and every pyproject key is general or a method's."""
    defaults = set(load_defaults())
    fields = [*TOP, *(f.name for kind in GROUPS.values() for f in dataclasses.fields(kind))]
    assert sorted(fields) == sorted(ORDER)  # each key's field in one place, and in the order
    general = {name.replace("_", "-") for name in fields}
    owned = [key for spec in METHODS.values() for key in spec.params.config_keys()]
    assert len(owned) == len(set(owned)), owned
    assert set(owned) <= defaults
    assert defaults == general | set(owned)
    assert general == GENERAL_KEYS  # what the parse takes for general, the rest the methods'


def test_a_parse_loads_the_chosen_methods_module_and_all_only_for_anothers_key() -> None:
    """The registry imports a method's module on first use: a SCAFFOLD config loads
    SCAFFOLD's rules, not FedRelax's graphs; a value given for another method's key loads
    every method, which checks its own (a bad fedcm-alpha fails under SCAFFOLD too)."""
    probe = ("import sys\nfrom fedinit.config import RunConfig\n"
             "RunConfig.parse({'method': 'scaffold'})\n"
             "print(sorted(m for m in sys.modules if m.startswith('fedinit.methods.f')\n"
             "             or m.endswith(('scaffold', 'clustered', 'ditto'))))\n"
             "RunConfig.parse({'method': 'scaffold', 'fedcm-alpha': 0.5})\n"
             "print(all(f'fedinit.methods.{h}' in sys.modules for h in "
             "('fedrelax', 'clustered', 'fedcm', 'ditto')))\n")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert out == ["['fedinit.methods.scaffold']", "True"], out
    assert "fedcm-alpha=1.5" in one_line_refusal({"method": "scaffold", "fedcm-alpha": 1.5})
    for name, home in HOMES.items():
        assert METHODS[name] is importlib.import_module(f"fedinit.methods.{home}").SPEC


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
    msg = one_line_refusal({key: value})
    assert f"{key}=" in msg and repr(value) in msg and allowed in msg


PULLS = [("ditto", "ditto-lambda"), ("fedprox", "prox-mu"), ("feddyn", "feddyn-alpha")]


@pytest.mark.parametrize(("method", "key"), PULLS)
def test_a_pull_that_diverges_at_the_learning_rate_is_refused(method: str, key: str) -> None:
    """lr x strength >= 2: refused for the method that uses the key, with the bound named."""
    RunConfig.parse({"method": method, "lr": 0.1, key: 19.9})
    msg = one_line_refusal({"method": method, "lr": 0.1, key: 20.0})
    assert f"{key}=20.0" in msg and "less than 2 / lr = 20 at lr=0.1" in msg
    other = "fedavg" if method != "fedavg" else "fedprox"
    assert RunConfig.parse({"method": other, "lr": 0.1, key: 20.0}).method == other  # unused


@pytest.mark.parametrize("product", [1.9, 2.1])
def test_the_bound_is_where_the_ditto_pull_starts_to_diverge(product: float) -> None:
    """Independent of the check: Ditto's own gradient hook, stepped by torch's SGD with no
    data gradient, shrinks the distance to the anchor below lr x lambda = 2 and grows it
    above."""
    import numpy as np
    import torch

    from fedinit.methods.ditto import DittoClient, DittoParams

    lr, lam = 0.1, product / 0.1
    anchor = [np.zeros(3, dtype=np.float32)]
    hook = DittoClient(DittoParams(ditto_lambda=lam)).pull(anchor, torch.device("cpu"))
    assert hook is not None
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=lr)
    for _ in range(40):
        p.grad = torch.zeros_like(p)
        hook([p])
        opt.step()
    distance = float(p.detach().abs().max())
    assert (distance < 0.02) if product < 2 else (distance > 40), distance  # 0.9^40, 1.1^40
