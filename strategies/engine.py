"""The round engine: one loop that every schedule runs in.

A schedule is an iterator of steps. Under ``rounds=sync`` a step is a round: the sampled
clients' train messages sent, their replies collected within ``round-timeout`` (or the first
m accepted ones under over-selection, or in simulated order on the virtual clock) and
aggregated (``strategies/sync_schedule.py``). Under ``rounds=async`` a step is a flush of
FedBuff's buffer: ``concurrency`` clients kept busy and every ``buffer-size`` accepted replies
applied (``strategies/async_loop.py``). How a step collects its replies is the schedule's;
what happens between steps is this loop's, the same for both: the caller sees each step once
it is done (rows, evaluation, checkpoints, Flower's ``Result``), before anything of the next
is sent, and ends the run by returning True (a budget spent, a target reached). The
project's experiment (``server_app/experiment.py``) and every strategy's ``start()``
(``strategies/schedules.py``) run their schedules here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from flwr.app import ArrayRecord, Message

from fedinit.methods.weights import Weights

D = TypeVar("D")
"""The schedule's own record of a step: ``sync_schedule.RoundDone`` or ``fedbuff.Flush``."""


@dataclass(frozen=True)
class Step(Generic[D]):
    """One step as the schedule saw it: a synchronous round or an asynchronous flush."""

    number: int
    """The round, or the model version the flush made."""
    arrays: ArrayRecord | None = None
    """The next global model as a round's aggregation returned it (synchronous schedules;
    None there: a stage held the round back and the model is unchanged)."""
    weights: Weights | None = None
    """The next global model as arrays (the asynchronous schedule: a flush always has one)."""
    metrics: dict[str, Any] = field(default_factory=dict)
    """The step's train metrics, as Flower's ``Result`` keeps them."""
    fields: dict[str, Any] = field(default_factory=dict)
    """The row fields the schedule knows (bytes, timings, counts, staleness, ...)."""
    messages: list[Message] = field(default_factory=list)
    """The train messages the step made (synchronous rounds: a lost task's too)."""
    replies: list[Message] = field(default_factory=list)
    """The replies it collected (synchronous rounds)."""
    detail: D = field(kw_only=True)
    """The schedule's own record of the step (``RoundDone``, or the ``Flush``)."""

    @property
    def held(self) -> bool:
        """The model did not change (a synchronous round without a usable quorum)."""
        return self.arrays is None and self.weights is None


Steps = Generator[Step[D], None, None]
"""A schedule's run: each step made only when the loop asks for it (``SyncSchedule.steps``,
``AsyncLoop.steps``)."""


def run_steps(steps: Steps[D], on_step: Callable[[Step[D], float], bool | None]) -> int:
    """Run a schedule's ``steps`` to their end, or until ``on_step`` returns True; the steps
    run.

    ``on_step(step, began)`` is called once per step, before the schedule sends anything of
    the next one; ``began`` is when the loop asked for the step (``time.monotonic()``, after
    the previous step was handled), so a row's seconds are the step's collection and what its
    caller does with it."""
    ran = 0
    while True:
        began = time.monotonic()
        step = next(steps, None)
        if step is None:
            return ran
        ran += 1
        if on_step(step, began):
            steps.close()  # a generator schedule ends here: nothing more is sent
            return ran
