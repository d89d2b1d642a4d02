"""Flower 1.39 ``FedAvg``'s own arguments, taken by every ``strategies`` class with their
meaning in Flower, so a user swaps ``FedAvg(...)`` for ``FedInit(...)`` without edits.

- ``weighted_by_key``: the MetricRecord key whose value weighs the averages of the user's
  metrics (train and evaluate replies), as in Flower. The MODEL's weights stay the method's
  (``weighting``: the count the client half reports, or uniform): a user's metric never
  weighs an upload.
- ``train_metrics_aggr_fn`` / ``evaluate_metrics_aggr_fn``: ``(list[RecordDict], key) ->
  MetricRecord``, Flower's ``aggregate_metricrecords`` by default. The train replies given to
  it are those the project's checks accepted (a rejected reply's figures are never averaged).
- ``arrayrecord_key`` / ``configrecord_key``: only Flower's defaults, ``"arrays"`` and
  ``"config"``: the client half reads the train message under those names
  (``fedinit.methods.wire``), so another name is refused at construction in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from flwr.app import Message, MetricRecord, RecordDict
from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords

from fedinit.methods import wire as rk

MetricsAggr = Callable[[list[RecordDict], str], MetricRecord]
"""Flower's metrics aggregation: the replies' contents and the weighting key."""


class FlowerArgError(ValueError):
    """A Flower argument this strategy cannot honour; one line naming it."""


@dataclass(frozen=True)
class FlowerArgs:
    """The Flower ``FedAvg`` arguments of one strategy, checked at construction."""

    weighted_by_key: str = rk.NUM_EXAMPLES
    arrayrecord_key: str = rk.ARRAYS
    configrecord_key: str = rk.CONFIG
    train_metrics_aggr_fn: MetricsAggr | None = None
    evaluate_metrics_aggr_fn: MetricsAggr | None = None

    def __post_init__(self) -> None:
        for arg, value, wire in (("arrayrecord_key", self.arrayrecord_key, rk.ARRAYS),
                                 ("configrecord_key", self.configrecord_key, rk.CONFIG)):
            if value != wire:
                raise FlowerArgError(
                    f"{arg}={value!r} is not allowed; allowed: {wire!r} (the name "
                    "strategies.client.method_train reads the train message under)")
        if not isinstance(self.weighted_by_key, str) or not self.weighted_by_key:
            raise FlowerArgError(f"weighted_by_key={self.weighted_by_key!r} is not allowed; "
                                 "allowed: a non-empty metric name")
        for arg, fn in (("train_metrics_aggr_fn", self.train_metrics_aggr_fn),
                        ("evaluate_metrics_aggr_fn", self.evaluate_metrics_aggr_fn)):
            if fn is not None and not callable(fn):
                raise FlowerArgError(f"{arg}={fn!r} is not allowed; allowed: None or a "
                                     "function (list[RecordDict], str) -> MetricRecord")

    def train_metrics(self, replies: Iterable[Message],
                      rejected: Mapping[int, str]) -> MetricRecord:
        """The user's train metrics: ``train_metrics_aggr_fn`` (Flower's weighted mean by
        default) over the replies the project's checks accepted; empty when none. With
        Flower's default, a reply without ``weighted_by_key`` is left out (Flower's FedAvg
        would have refused the whole round)."""
        kept = [m.content for m in replies
                if not m.has_error() and int(m.metadata.src_node_id) not in rejected
                and m.content.metric_records]
        fn = self.train_metrics_aggr_fn
        if fn is None:
            kept = [c for c in kept if _weight(c, self.weighted_by_key) is not None]
            fn = aggregate_metricrecords
        return fn(kept, self.weighted_by_key) if kept else MetricRecord()


def _weight(content: RecordDict, key: str) -> float | None:
    """The weighting value of the reply's first MetricRecord (as Flower reads it), or None
    when it is missing or not a number."""
    record = next(iter(content.metric_records.values()))
    value = record.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) \
        else None


__all__ = ["FlowerArgError", "FlowerArgs", "MetricsAggr"]
