"""The ``rounds=`` schedules a strategy's ``start()`` runs on a user's grid, on the project's own
engines: ``OverSelect`` closes each of Flower's sync rounds at the first m accepted replies
(``strategies.over_select.collect_first``, the experiment loop's), ``BufferedAsync`` runs the
FedBuff loop (``strategies.async_loop.AsyncLoop``, the experiment's too) in place of Flower's
round loop. Loaded only when a strategy uses one of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping
from logging import INFO
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from fedinit.flower_compat.grid_view import GridView
from fedinit.methods import wire as rk
from fedinit.methods.weights import Weights
from fedinit.task.config import RunConfig
from strategies.over_select import collect_first


class FirstReplies(GridView):
    """A train round's ``send_and_receive`` pushes its messages and returns at the first
    ``need`` replies ``accepts`` takes (``OverSelect``)."""

    def __init__(self, grid: Grid, need: int, accepts: Callable[[Message], bool]) -> None:
        super().__init__(grid)
        self.need, self.accepts = need, accepts
        self.last: dict[str, int] = {}
        """The last train round's over-select figures (``Collected.fields``)."""

    def send_and_receive(self, messages: Iterable[Message], *,
                         timeout: float | None = None) -> Iterable[Message]:
        msgs = list(messages)
        if not msgs or any(m.metadata.message_type != MessageType.TRAIN for m in msgs):
            return self.inner.send_and_receive(msgs, timeout=timeout)
        conf = msgs[0].content.config_records[rk.CONFIG]
        got = collect_first(self.inner, msgs, self.need, self.accepts,
                            3600.0 if timeout is None else timeout,
                            int(conf[rk.ROUND]))  # type: ignore[arg-type]
        self.last = got.fields(len(msgs))
        return got.replies


class WithInitial(GridView):
    """Each pushed train message passes through ``add`` first: under RI the adapter's
    ``add_initial`` (w_0 for a client with no aggregated reply yet), as its sync
    ``configure_train`` does, for the FedBuff loop that builds its own messages."""

    def __init__(self, grid: Grid, add: Callable[[Message], None]) -> None:
        super().__init__(grid)
        self.add = add

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        msgs = list(messages)
        for msg in msgs:
            if msg.metadata.message_type == MessageType.TRAIN:
                self.add(msg)
        return self.inner.push_messages(msgs)


class CheckedReplies(GridView):
    """Each pulled train reply goes to ``check`` (the adapter's ``ClientHalfCheck``, one
    reply as one round): FedBuff's loop stops, naming ``strategies.client.method_train``,
    after ``stop_after_foreign_rounds`` replies in a row from a ClientApp without it."""

    def __init__(self, grid: Grid, check: Callable[[int, list[Message]], None]) -> None:
        super().__init__(grid)
        self.check = check
        self.seen = 0

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out = list(self.inner.pull_messages(message_ids))
        for msg in out:
            if msg.metadata.message_type == MessageType.TRAIN:
                self.seen += 1
                self.check(self.seen, [msg])
        return out


def async_config(cfg: RunConfig, num_rounds: int, timeout: float) -> RunConfig:
    """``cfg`` with Flower's ``num_rounds`` as the flushes to run and ``timeout`` as the
    time a task may take (``round-timeout``)."""
    return dataclasses.replace(
        cfg, train=dataclasses.replace(cfg.train, num_server_rounds=num_rounds),
        fleet=dataclasses.replace(cfg.fleet, round_timeout=float(timeout)))


def run_buffered(grid: Grid, cfg: RunConfig, node_of: Mapping[int, int], w0: Weights,
                 available: Callable[[], Collection[int]], round_config: ConfigRecord,
                 evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None,
                 as_record: Callable[[Weights], ArrayRecord]) -> tuple[Result, Any]:
    """FedBuff's loop for ``cfg.train.num_server_rounds`` flushes; (Flower's ``Result``: one
    train MetricRecord per flush, the project's flush figures; the loop's strategy).
    ``evaluate_fn`` is called before the first flush and after each, as Flower's loop
    calls it each round."""
    from strategies.async_loop import AsyncLoop, BufferedStrategy

    strategy = BufferedStrategy(cfg, node_of, w0, examples=None, available=available)
    loop = AsyncLoop(grid, cfg, strategy, available, node_of, round_config)
    result = Result()
    if evaluate_fn is not None:
        first = evaluate_fn(0, as_record(w0))
        if first is not None:
            result.evaluate_metrics_serverapp[0] = first

    def on_flush(flush: Any, facts: dict[str, Any]) -> None:
        version = int(flush.version)
        result.train_metrics_clientapp[version] = MetricRecord(
            {k: v for k, v in facts.items() if isinstance(v, int | float) and v is not None
             and not isinstance(v, bool)})
        log(INFO, "[version %d/%d] replies %d staleness mean %.2f max %d dropped %d", version,
            cfg.train.num_server_rounds, flush.replies, facts["staleness-mean"],
            facts["staleness-max"], flush.dropped)
        if evaluate_fn is not None:
            got = evaluate_fn(version, as_record(flush.weights))
            if got is not None:
                result.evaluate_metrics_serverapp[version] = got

    final = loop.run(w0, on_flush)
    result.arrays = as_record(final)
    return result, strategy


__all__ = ["CheckedReplies", "FirstReplies", "GridView", "WithInitial", "async_config",
           "run_buffered"]
