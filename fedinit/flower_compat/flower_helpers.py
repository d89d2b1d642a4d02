"""Flower's private helpers the project's robust aggregation reuses, behind one guard.

``fedinit/methods/robust.py`` computes the trimmed mean, Multi-Krum's selection and Bulyan's closest
values with Flower's own functions, so its results are Flower's. They are not Flower's public
API; if their source is not the one checked (table entry ``flower-helpers``), the first call
logs one warning and the project goes on with Flower's function as it is now (there is no
other behaviour to fall back to: these are Flower's own).
"""

from __future__ import annotations

from typing import Any

from fedinit.flower_compat.guard import allowed

NAME = "flower-helpers"


def trim_mean(array: Any, cut_fraction: float) -> Any:
    """``flwr.serverapp.strategy.fedtrimmedavg.trim_mean``."""
    from flwr.serverapp.strategy.fedtrimmedavg import trim_mean as flower_trim_mean

    allowed(NAME)
    return flower_trim_mean(array, cut_fraction)


def select_multikrum(contents: Any, num_malicious_nodes: int,
                     num_nodes_to_select: int) -> Any:
    """``flwr.serverapp.strategy.multikrum.select_multikrum``."""
    from flwr.serverapp.strategy.multikrum import select_multikrum as flower_select

    allowed(NAME)
    return flower_select(contents, num_malicious_nodes=num_malicious_nodes,
                         num_nodes_to_select=num_nodes_to_select)


def aggregate_n_closest_weights(reference: Any, weights: Any, beta: int) -> Any:
    """``flwr.serverapp.strategy.bulyan.aggregate_n_closest_weights``."""
    from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights as flower_closest

    allowed(NAME)
    return flower_closest(reference, weights, beta)
