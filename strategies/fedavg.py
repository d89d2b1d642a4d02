"""FedAvg (McMahan et al. 2017); with beta != 0 it is FedInit (FedAvg + RI).

Server: w_{t+1} = w_t + eta_g * D, D the RI-variant aggregate update (``RIStrategy``).
Client: plain local SGD from the RI start point (``ClientRule``). Neither half adds anything:
FedAvg is the base every other method extends.
"""

from strategies.base import ClientRule, RIStrategy


class FedAvgServer(RIStrategy):
    """FedAvg's server half: the shared RI aggregation and w_t + eta_g * D."""


class FedAvgClient(ClientRule):
    """FedAvg's client half: local SGD, no correction, no extra state."""
