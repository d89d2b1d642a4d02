"""FedAvg (McMahan et al. 2017); with beta != 0 it is FedInit (FedAvg + RI).

Server: w_{t+1} = w_t + eta_g * D, D the RI-variant aggregate update. Client: plain local SGD
from the RI start point. Neither half adds anything: FedAvg is the base every method extends.
"""

from fedinit.methods.method import ClientRule, MethodSpec, Params, ServerRule, ServerState


class FedAvgServer(ServerRule[Params, ServerState]):
    """FedAvg's server half: w_t + eta_g * D, no state."""


class FedAvgClient(ClientRule[Params]):
    """FedAvg's client half: local SGD, no correction, no extra state."""


SPEC = MethodSpec(name="fedavg", label="FedAvg", ri_label="FedInit", params=Params,
                  server=FedAvgServer, client=FedAvgClient, ri_aggregation="model",
                  async_refusal=None, secagg_refusal=None)
