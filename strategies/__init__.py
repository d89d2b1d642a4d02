"""The project's methods as Flower strategies for any Flower app, and their client half.

Server (a ServerApp): ``from strategies import FedInit`` then
``FedInit(beta=0.1, fraction_train=0.1).start(grid=grid, initial_arrays=..., num_rounds=...)``
returns Flower's ``Result``. Classes: FedAvg, FedInit, FedProx, FedAdam, Scaffold, FedDyn,
FedCM, FedSAM, Ditto, FedRelax, ClusteredFL (``strategies/catalog.py``), all over one adapter
(``strategies/base.py``) of the project's ``MethodStrategy``.

Capabilities, as constructor arguments: ``FedInit(privacy=CentralDP(noise_multiplier=1.0),
weighting="uniform")``, ``aggregation=Krum(byzantine_f=1)``, ``secure_aggregation=SecAgg()``,
``rounds=BufferedAsync(buffer_size=10)`` (``strategies/components.py``, also importable from
here).

Client (a ClientApp): ``from strategies.client import method_train`` (``strategies/client.py``),
and ``method_query`` for SecAgg+'s query stages.

The server classes load on first use, so a ClientApp importing ``strategies.client`` does not
import the server's modules. ``examples/tabular-quickstart`` is a whole app using both.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from strategies.base import MethodAdapter
    from strategies.catalog import (
        ClusteredFL,
        Ditto,
        FedAdam,
        FedAvg,
        FedCM,
        FedDyn,
        FedInit,
        FedProx,
        FedRelax,
        FedSAM,
        Scaffold,
    )
    from strategies.components import (
        BufferedAsync,
        Bulyan,
        CentralDP,
        DistributedDP,
        Krum,
        LocalDP,
        Mean,
        Median,
        MultiKrum,
        OverSelect,
        SecAgg,
        SyncRounds,
        TrimmedMean,
    )

__all__ = ["BufferedAsync", "Bulyan", "CentralDP", "ClusteredFL", "DistributedDP", "Ditto",
           "FedAdam", "FedAvg", "FedCM", "FedDyn", "FedInit", "FedProx", "FedRelax", "FedSAM",
           "Krum", "LocalDP", "Mean", "Median", "MethodAdapter", "MultiKrum", "OverSelect",
           "Scaffold", "SecAgg", "SyncRounds", "TrimmedMean"]
COMPONENTS = frozenset({"BufferedAsync", "Bulyan", "CentralDP", "DistributedDP", "Krum",
                        "LocalDP", "Mean", "Median", "MultiKrum", "OverSelect", "SecAgg",
                        "SyncRounds", "TrimmedMean"})
"""The names ``strategies.components`` gives (the capabilities a strategy takes)."""


def __getattr__(name: str) -> Any:
    if name == "MethodAdapter":
        return importlib.import_module("strategies.base").MethodAdapter
    if name in COMPONENTS:
        return getattr(importlib.import_module("strategies.components"), name)
    if name in __all__:
        return getattr(importlib.import_module("strategies.catalog"), name)
    raise AttributeError(f"module 'strategies' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
