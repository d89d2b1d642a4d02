"""The method registry: every method's spec, by its run-config ``method`` name.

The one list of methods. The run config (``fedinit.config``) takes the method names, their
parameters and their ``auto`` defaults from here; the apps take the two halves; reports take
the labels. A method's rules are one module with a ``SPEC`` and one line below; the other
files a new method touches (its Flower class, its docs rows) are listed in
docs/architecture.md, "Adding a method".
"""

from __future__ import annotations

from collections.abc import Mapping

from fedinit.lazy import SpecRegistry
from fedinit.methods.method import MethodSpec
from fedinit.methods.robust_choices import AGGREGATIONS as AGGREGATIONS  # the run config's list

HOMES: dict[str, str] = {
    "fedavg": "fedavg", "fedprox": "fedprox", "fedadam": "fedadam", "scaffold": "scaffold",
    "feddyn": "feddyn", "fedcm": "fedcm", "fedsam": "fedsam", "ditto": "ditto",
    "fedrelax": "fedrelax", "clustered": "clustered",
}
"""Method name -> its module under ``fedinit.methods`` (which holds its ``SPEC``), in the
order the docs and reports list them."""


METHODS: Mapping[str, MethodSpec] = SpecRegistry("fedinit.methods", HOMES, MethodSpec)
"""The specs by name, each module imported on first use: a server that runs FedInit loads
FedAvg's rules, not FedRelax's graphs or clustered FL's k-means (issue 43: a strategy
loads what its half needs). Iterating the values loads every method."""
METHOD_NAMES: tuple[str, ...] = tuple(HOMES)

RI_AGGREGATIONS: tuple[str, ...] = ("auto", "model", "update")
"""``auto`` is each method's own default (``MethodSpec.ri_aggregation``): ``model`` is
Algorithm 1 (FedInit). The methods whose server state is built from the aggregate update D
(Adam's moments, FedCM's momentum, FedDyn's H) get ``update``: under ``model`` the RI offset
beta (w_t - w_prev_i) enters D, that state replays it into the next rounds, and the loop gains
> 1 (measured: FedAdam + RI -18/-20 points, FedCM + RI to chance; docs/reproduction.md)."""
WEIGHTINGS: tuple[str, ...] = ("examples", "uniform")


def method_param_keys() -> frozenset[str]:
    """Every run-config key that belongs to one method's parameters."""
    return frozenset(key for spec in METHODS.values() for key in spec.params.config_keys())


def composes_with_ri(method: str) -> bool:
    """Whether ``method`` runs with RI (beta != 0) and DP; FedRelax and clustered FL do not
    (``ServerRule.per_client_refusal``): their clients train from their own or their
    cluster's model, not a global one."""
    return not METHODS[method].server.per_client_refusal


def async_methods() -> tuple[str, ...]:
    """The methods ``rounds=async`` runs (``MethodSpec.async_refusal`` None), in registry
    order: the allowed list of the run config's refusal."""
    return tuple(name for name, spec in METHODS.items() if spec.async_refusal is None)


def secagg_methods() -> tuple[str, ...]:
    """The methods ``secure-aggregation=secagg+`` runs (``MethodSpec.secagg_refusal`` None),
    in registry order."""
    return tuple(name for name, spec in METHODS.items() if spec.secagg_refusal is None)
