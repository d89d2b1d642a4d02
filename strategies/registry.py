"""The method registry: a run-config ``method`` name -> its server half and client half."""


from __future__ import annotations

from dataclasses import dataclass

from strategies.base import ClientRule, RIStrategy
from strategies.fedadam import FedAdamClient, FedAdamServer
from strategies.fedavg import FedAvgClient, FedAvgServer
from strategies.fedcm import FedCmClient, FedCmServer
from strategies.feddyn import FedDynClient, FedDynServer
from strategies.fedprox import FedProxClient, FedProxServer
from strategies.fedsam import FedSamClient, FedSamServer
from strategies.scaffold import ScaffoldClient, ScaffoldServer


@dataclass(frozen=True)
class Method:
    """A method's two halves: the server strategy class and the client rule class."""

    server: type[RIStrategy]
    client: type[ClientRule]


METHODS: dict[str, Method] = {
    "fedavg": Method(FedAvgServer, FedAvgClient),
    "fedprox": Method(FedProxServer, FedProxClient),
    "fedadam": Method(FedAdamServer, FedAdamClient),
    "scaffold": Method(ScaffoldServer, ScaffoldClient),
    "feddyn": Method(FedDynServer, FedDynClient),
    "fedcm": Method(FedCmServer, FedCmClient),
    "fedsam": Method(FedSamServer, FedSamClient),
}
