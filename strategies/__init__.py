"""One module per federated algorithm, each holding its server half and its client half.

``METHODS`` maps a run-config ``method`` name to its pair; RI (relaxed initialization) lives
in ``strategies.ri`` and composes with all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from strategies.base import ClientRule, RIStrategy
from strategies.fedavg import FedAvgClient, FedAvgServer


@dataclass(frozen=True)
class Method:
    """A method's two halves: the server strategy class and the client rule class."""

    server: type[RIStrategy]
    client: type[ClientRule]


METHODS: dict[str, Method] = {
    "fedavg": Method(FedAvgServer, FedAvgClient),
}
