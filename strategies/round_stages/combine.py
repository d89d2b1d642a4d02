"""Stage 8, combine: each contribution's weight and the round's aggregate update D under the
RI variant (``fedinit.methods.ri.aggregate_update``), by the run's rule or, under DP, the sum over a
fixed denominator (``Mechanism.mean``), chosen where the pipeline is built."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from fedinit.config import RunConfig
from fedinit.methods.method import ClientUpdate
from fedinit.methods.ri import aggregate_update, weighted_mean
from fedinit.methods.weights import Weights
from strategies.round_stages.replies import RoundReplies

Mean = Callable[[Sequence[Weights], Sequence[float]], Weights]
"""How one vector per contribution becomes one: (vectors, weights) -> vector."""


@dataclasses.dataclass(frozen=True)
class RobustMean:
    """The run's ``aggregation`` rule (``fedinit.methods.robust.combine``) as a ``Mean``;
    under ``mean`` its weighted mean (``combine``'s own), without loading the robust rules
    or Flower's helpers."""

    cfg: RunConfig

    def __post_init__(self) -> None:
        if self.cfg.robust.aggregation != "mean":  # a rule computed with Flower's helpers
            from fedinit.flower_compat import flower_helpers

            flower_helpers.check()

    def __call__(self, vectors: Sequence[Weights], weights: Sequence[float]) -> Weights:
        r = self.cfg.robust
        if r.aggregation == "mean":
            return weighted_mean(vectors, weights)
        from fedinit.methods.robust import combine

        return combine(vectors, weights, r.aggregation, r.trim_fraction, r.byzantine_f)


def reply_weights(weighting: str, updates: Sequence[ClientUpdate]) -> list[float]:
    """Each reply's weight in the round's mean (``weighting``): its examples, or 1."""
    if weighting == "uniform":
        return [1.0] * len(updates)
    return [float(u.num_examples) for u in updates]


@dataclasses.dataclass(frozen=True)
class Combine:
    """Sets ``weights``, D (``aggregate``) and the server's view of each final model."""

    variant: str
    weighting: str
    mean: Mean

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        updates = replies.contributions
        weights = reply_weights(self.weighting, updates)
        aggregate, finals = aggregate_update(replies.w_t, [u.upload for u in updates],
                                             weights, self.variant, mean=self.mean)
        return dataclasses.replace(replies, weights=tuple(weights), aggregate=aggregate,
                                   finals=finals)
