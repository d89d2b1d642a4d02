"""The engine's synchronous schedule: rounds of a ``MethodStrategy`` on a grid, each a step of
the round engine (``strategies/engine.py``).

A round is the strategy's train messages sent, the replies collected and aggregated. How they
are collected is the schedule's: all of them within ``round-timeout``; under over-selection
(``over-select`` o > 0) the first m accepted ones close the round (``strategies/over_select.py``);
on the virtual clock (``device-speeds``) in simulated order, the round waiting until enough
clients are in an availability window and never sending a task whose window closes before it
ends (``strategies/virtual_clock.py``). ``rounds=async`` is the other schedule
(``strategies/async_loop.py``). What a run adds around a round (evaluation, rows,
checkpoints, the DP ledger, the fleet's status) is its caller's, in the engine's ``on_step``:
the project's experiment (``server_app/experiment.py``) or a strategy's ``start()``
(``strategies/schedules.py``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from strategies.download_bytes import content_bytes
from strategies.engine import Step, Steps
from strategies.method_strategy import MethodStrategy
from strategies.over_select import collect_first
from strategies.round_stages.replies import state_fallbacks
from strategies.virtual_clock import VirtualClock


@dataclass(frozen=True)
class RoundDone:
    """One round as the engine saw it; its caller evaluates, records and checkpoints."""

    arrays: ArrayRecord | None
    """The next global model (None: a stage held the round back, the model is unchanged)."""
    metrics: dict[str, Any]
    """The strategy's round counts and metrics (``aggregate_train``'s)."""
    messages: list[Message]
    """The train messages the round made (a lost task's too, never sent)."""
    replies: list[Message]
    fields: dict[str, Any] = field(default_factory=dict)
    """Row fields of the schedule: ``bytes-down``, ``collect-seconds``,
    ``client-seconds-max`` and, on the clock, ``sim-time``."""
    over: dict[str, int] = field(default_factory=dict)
    """Under over-selection its row fields (``Collected.fields``); else empty."""
    fallbacks: int = 0
    """Replies whose client could not use its saved state (``state-fallbacks``)."""


class SyncSchedule:
    """Runs one synchronous round at a time (module docstring)."""

    def __init__(self, strategy: MethodStrategy, grid: Grid, cfg: RunConfig,
                 clock: VirtualClock | None = None, front: Strategy | None = None) -> None:
        """``front``: the Flower strategy whose ``configure_train`` and ``aggregate_train``
        a round calls, one that wraps ``strategy`` (a ``strategies`` class, which adds what
        a user's app needs); None: ``strategy``'s own."""
        self.strategy, self.grid, self.cfg, self.clock = strategy, grid, cfg, clock
        self.front: Strategy = strategy if front is None else front
        self.windowed = clock if clock is not None and clock.windows is not None else None
        """The clock when its file has availability windows (else None)."""
        self.available = strategy.available
        """The clients that may take part now (the fleet's); with windows the strategy's
        sampler is handed, each round, those of them in a window then."""

    def steps(self, arrays: ArrayRecord, first: int, last: int, round_config: ConfigRecord,
              before_round: Callable[[int], bool] | None = None,
              before_send: Callable[[int], None] | None = None) -> Steps[RoundDone]:
        """Rounds ``first`` to ``last`` from the model ``arrays``, each a step of the engine:
        ``before_round(rnd)`` runs first (True: the run ends before that round),
        ``before_send(rnd)`` once its messages exist and before the first is sent."""
        for rnd in range(first, last + 1):
            if before_round is not None and before_round(rnd):
                return
            done = self.run(rnd, arrays, round_config,
                            None if before_send is None else functools.partial(before_send, rnd))
            if done.arrays is not None:
                arrays = done.arrays
            yield Step(rnd, arrays=done.arrays, metrics={**done.metrics, **done.over},
                       fields={**done.fields, **done.metrics, "state-fallbacks": done.fallbacks,
                               **done.over},
                       messages=done.messages, replies=done.replies, detail=done)

    def run(self, rnd: int, arrays: ArrayRecord, round_config: ConfigRecord,
            before_send: Callable[[], None] | None = None) -> RoundDone:
        """Round ``rnd`` from the model ``arrays``; ``before_send`` runs once the messages
        exist and before the first is sent (the DP ledger counts the round there)."""
        strategy, cfg, clock, windowed = self.strategy, self.cfg, self.clock, self.windowed
        if windowed is not None:  # the round starts once enough clients are in a window;
            ready = windowed.wait_for(self.available(), cfg.sampled_per_round, rnd)
            strategy.available = ready.copy  # the sampler draws among those
        messages = list(self.front.configure_train(rnd, arrays, round_config, self.grid))
        if before_send is not None:
            before_send()
        over: dict[str, int] = {}
        lost = {} if windowed is None else windowed.lost(strategy.sent_to)
        sending = messages if windowed is None else windowed.drop_lost(
            messages, lost, strategy.sent_to, rnd)  # a lost task is never sent
        down = content_bytes(sending)  # bytes-down: the train messages this round sends
        timeout, m = cfg.fleet.round_timeout, cfg.clients_per_round
        t_send = time.monotonic()
        if clock is not None and cfg.fleet.over_select > 0.0:  # the first m in simulated order
            got = clock.close_first(list(self.grid.send_and_receive(sending, timeout=timeout)),
                                    m, strategy.sent_to, strategy.accepts, rnd)
            if got.accepted >= m:  # closed early: the lost don't count
                lost = {}
            replies, over = got.replies, got.fields(len(messages))
        elif cfg.fleet.over_select > 0.0:  # the first m accepted replies close the round
            got = collect_first(self.grid, messages, m, strategy.accepts, timeout, rnd)
            replies, over = got.replies, got.fields(len(messages))
        else:
            replies = list(self.grid.send_and_receive(sending, timeout=timeout))
        timing = reply_timing(replies, time.monotonic() - t_send)
        if clock is not None:
            clock.sync_round(replies, strategy.sent_to, max(lost.values(), default=0.0))
            timing["sim-time"] = clock.now
        new_arrays, metrics = self.front.aggregate_train(rnd, replies)
        return RoundDone(new_arrays, dict(metrics or {}), messages, replies,
                         {rk.BYTES_DOWN: down, **timing}, over, state_fallbacks(replies))


def reply_timing(replies: Sequence[Message], collect_seconds: float) -> dict[str, float | None]:
    """How long the round waited for its replies, and the slowest client's own compute.

    Their difference is the round's overhead (transport, polling, process start-up)."""
    compute = []
    for msg in replies:
        if not msg.has_error() and rk.METRICS in msg.content.metric_records:
            value = msg.content.metric_records[rk.METRICS].get(rk.COMPUTE_SECONDS)
            if isinstance(value, float) and math.isfinite(value):
                compute.append(value)
    return {"collect-seconds": collect_seconds,
            "client-seconds-max": max(compute) if compute else None}
