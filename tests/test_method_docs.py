"""Every registered method has its row in the docs: the ``method`` row of docs/configuration.md
(the run-config table), the table of docs/algorithms.md, and pyproject's description. Adding a
method without them fails here."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from fedinit.config import ConfigError, RunConfig
from fedinit.methods.method import MethodSpec
from fedinit.methods.registry import METHODS

REPO = Path(__file__).resolve().parents[1]


def missing_rows(specs: list[MethodSpec], configuration: str, algorithms: str,
                 description: str) -> list[str]:
    """Where a method is not documented, one line each."""
    method_row = next((line for line in configuration.splitlines()
                       if line.startswith("| `method` |")), "")
    table = [line for line in algorithms.splitlines() if line.startswith("|")]
    missing = []
    for spec in specs:
        module = spec.client.__module__.rsplit(".", 1)[-1]
        if f"`{spec.name}`" not in method_row:
            missing.append(f"docs/configuration.md: the `method` row lacks `{spec.name}`")
        if not any(line.startswith(f"| {spec.label} |") and f"`{module}." in line
                   for line in table):
            missing.append(f"docs/algorithms.md: no table row '| {spec.label} |' naming "
                           f"`{module}.`")
        if spec.label not in description:
            missing.append(f"pyproject.toml: the description lacks {spec.label}")
    return missing


def _docs() -> tuple[str, str, str]:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return ((REPO / "docs" / "configuration.md").read_text(),
            (REPO / "docs" / "algorithms.md").read_text(),
            meta["description"])


def test_every_registered_method_is_documented() -> None:
    assert not missing_rows(list(METHODS.values()), *_docs())


def test_a_method_without_docs_is_found() -> None:
    spec = METHODS["fedavg"]
    ghost = MethodSpec(name="fedghost", label="FedGhost", params=spec.params,
                       server=spec.server, client=spec.client, ri_aggregation="model",
                       async_refusal=None, secagg_refusal=None)
    assert len(missing_rows([ghost], *_docs())) == 3


def test_the_server_lr_message_reads_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"\(0\.1 for fedadam, 1 otherwise\)"):
        RunConfig.parse({"server-lr": -1.0})
    monkeypatch.setattr("fedinit.methods.fedcm.SPEC",
                        dataclasses.replace(METHODS["fedcm"], server_lr=0.5))
    with pytest.raises(ConfigError, match=r"\(0\.1 for fedadam, 0\.5 for fedcm, 1 otherwise\)"):
        RunConfig.parse({"server-lr": -1.0})
