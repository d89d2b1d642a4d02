"""The ``rounds=`` schedules a strategy's ``start()`` runs on a user's grid, on the engine the
project's experiment runs too: ``SyncRounds()`` and ``OverSelect`` are rounds of
``strategies.sync_schedule.SyncSchedule`` (the first m accepted replies close an over-selected
round), ``BufferedAsync`` flushes of the FedBuff loop (``strategies.async_loop.AsyncLoop``),
both run by the round engine (``strategies/engine.py``) with what keeps Flower's
``Strategy.start`` contract after each step (its ``Result``, the evaluations, the log).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from logging import INFO
from typing import TYPE_CHECKING, Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import log_strategy_start_info

from fedinit.config import RunConfig
from fedinit.flower_compat.grid_view import GridView
from fedinit.methods.weights import Weights
from strategies.engine import Step, run_steps
from strategies.method_strategy import MethodStrategy

if TYPE_CHECKING:  # the schedules load at start(), not with the strategy
    from fedinit.methods.fedbuff import Flush
    from strategies.sync_schedule import RoundDone


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


def run_sync(front: Strategy, inner: MethodStrategy, grid: Grid, initial_arrays: ArrayRecord,
             num_rounds: int, timeout: float, train_config: ConfigRecord | None,
             evaluate_config: ConfigRecord | None,
             evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None) -> Result:
    """Flower's ``Strategy.start`` on the engine's synchronous schedule: ``num_rounds``
    rounds of ``SyncSchedule`` calling ``front``'s ``configure_train`` / ``aggregate_train``
    (each round's train metrics with the over-select counts under ``OverSelect``), then
    ``front``'s federated evaluation and ``evaluate_fn``, into Flower's ``Result``."""
    from strategies.sync_schedule import SyncSchedule

    log(INFO, "Starting %s strategy:", type(front).__name__)
    log_strategy_start_info(num_rounds, initial_arrays, train_config, evaluate_config)
    front.summary()
    train_config = ConfigRecord() if train_config is None else train_config
    evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
    cfg = inner.cfg
    rounds = SyncSchedule(inner, grid, dataclasses.replace(
        cfg, fleet=dataclasses.replace(cfg.fleet, round_timeout=float(timeout))), front=front)
    result = Result()
    t_start = time.time()
    if evaluate_fn is not None:
        first = evaluate_fn(0, initial_arrays)
        log(INFO, "Initial global evaluation results: %s", first)
        if first is not None:
            result.evaluate_metrics_serverapp[0] = first
    arrays = initial_arrays

    def before_round(rnd: int) -> bool:
        log(INFO, "[ROUND %s/%s]", rnd, num_rounds)
        return False

    def on_round(step: Step[RoundDone], _began: float) -> bool:
        nonlocal arrays
        rnd = step.number
        if step.arrays is not None:
            result.arrays = arrays = step.arrays
        metrics = MetricRecord(step.metrics)
        log(INFO, "\t└──> Aggregated MetricRecord: %s", metrics)
        result.train_metrics_clientapp[rnd] = metrics
        evaluated = front.aggregate_evaluate(rnd, grid.send_and_receive(
            front.configure_evaluate(rnd, arrays, evaluate_config, grid), timeout=timeout))
        if evaluated is not None:
            log(INFO, "\t└──> Aggregated MetricRecord: %s", evaluated)
            result.evaluate_metrics_clientapp[rnd] = evaluated
        if evaluate_fn is not None:
            got = evaluate_fn(rnd, arrays)
            log(INFO, "\t└──> MetricRecord: %s", got)
            if got is not None:
                result.evaluate_metrics_serverapp[rnd] = got
        return False

    run_steps(rounds.steps(initial_arrays, 1, num_rounds, train_config, before_round), on_round)
    log(INFO, "Strategy execution finished in %.2fs", time.time() - t_start)
    return result


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

    def on_flush(step: Step[Flush], _began: float) -> bool:
        result.train_metrics_clientapp[step.number] = MetricRecord(step.metrics)
        log(INFO, "[version %d/%d] replies %d staleness mean %.2f max %d dropped %d",
            step.number, cfg.train.num_server_rounds, step.detail.replies,
            step.fields["staleness-mean"], step.fields["staleness-max"], step.detail.dropped)
        nonlocal final
        final = step.detail.weights
        if evaluate_fn is not None:
            got = evaluate_fn(step.number, as_record(final))
            if got is not None:
                result.evaluate_metrics_serverapp[step.number] = got
        return False

    final = w0
    run_steps(loop.steps(w0), on_flush)
    result.arrays = as_record(final)  # the user's record once, not at every flush
    return result, strategy


__all__ = ["CheckedReplies", "GridView", "WithInitial", "async_config", "run_buffered",
           "run_sync"]
