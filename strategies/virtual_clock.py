"""The virtual clock of ``device-speeds``: simulated time, independent of the machine's load.

Each client's task takes its simulated duration d_i (``fedinit.config.device_speeds``). A sync round
waits for its slowest reply: the clock advances by max d_i over the replies the round took.
With over-selection the round closes on simulated order, not arrival order: all replies are
collected, sorted by (d_i, client id), and the first m the decode checks accept are kept; the
round took d of the last one kept. ``rounds=async`` keeps its own times on the same durations
(``server_app/async_rounds.py``: each dispatch finishes at its send time + d_i). Every row
then carries ``sim-time``, the cumulative simulated seconds, beside the wall time.

Availability windows (a ``file:`` spec's ``START-END`` spans, ``fedinit.config.device_speeds``): a
client may be sampled at simulated t only if t lies in one of its windows, and a task it
starts at t is lost unless it finishes before that window's end (the device goes away
mid-task: the task is never sent, and it counts missing exactly as a dead node's). A sync
round starts at the first t >= now at which as many clients as it samples are available
(``wait_for``), so a round is never run short while waiting would fill it; when the windows
never again hold that many at once, at the first t holding the most they still will. A round
lasts until its last reply or, without over-selection's early close, until the last of its
lost devices left (so a round of lost tasks still moves the clock on). ``rounds=async``:
``server_app/async_rounds.py`` (``AsyncLoop.window_event``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from logging import INFO
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from fedinit.config import RunConfig
from fedinit.config.errors import ConfigError
from strategies.operator_log import log_line
from strategies.over_select import Collected

if TYPE_CHECKING:
    from fedinit.config.device_speeds import Windows

CLOCK_FIELDS = ("sim-time",)
"""The column a run with ``device-speeds`` on adds to each rounds.jsonl row: cumulative
simulated seconds at the row's end (a sync round's close, an async flush)."""


class VirtualClock:
    """Simulated time ``now`` and each client's task duration."""

    def __init__(self, task_seconds: Sequence[float] | np.ndarray, now: float = 0.0,
                 windows: Windows | None = None, private: bool = False) -> None:
        self.task_seconds = np.asarray(task_seconds, dtype=np.float64)
        self.now = float(now)
        self.private = private
        """Under DP the sample is secret: a line naming sampled clients goes to the
        operator's file (``strategies.operator_log``)."""
        self.windows = windows
        """Per client its availability windows (None: always available); None: no client
        has any, and the clock is exactly the one without windows."""

    @classmethod
    def for_run(cls, cfg: RunConfig, now: float = 0.0) -> VirtualClock | None:
        """The run's clock (None under ``device-speeds=off``), starting at ``now`` (a
        resumed run's last ``sim-time``): the speeds' module and the partitions' sizes (the
        data modules) load only for a run with ``device-speeds``."""
        if cfg.schedule.device_speeds == "off":
            return None
        from fedinit.config.device_speeds import durations, speeds_and_windows
        from fedinit.task.federated_data import partition_sizes

        slow, windows = speeds_and_windows(cfg.schedule.device_speeds, cfg.num_clients, cfg.seed)
        if slow is None:
            return None
        return cls(durations(slow, partition_sizes(cfg), cfg.train.local_epochs,
                             cfg.train.batch_size, cfg.schedule.task_time), now, windows,
                   private=cfg.privacy.dp != "off")

    def spans(self, cid: int) -> Sequence[tuple[float, float]] | None:
        """Client ``cid``'s windows (None: always available)."""
        return None if self.windows is None else self.windows[cid]

    def starts_after_now(self, cids: Iterable[int]) -> list[float]:
        """Every window start after ``now`` among ``cids``, sorted (only a start can add an
        available client)."""
        return sorted({a for p in cids for a, _ in (self.spans(p) or ()) if a > self.now})

    def window_of(self, cid: int, t: float) -> tuple[float, float] | None:
        """Client ``cid``'s window holding simulated time ``t`` (start <= t < end), or None;
        (t, inf) for a client without windows."""
        spans = self.spans(cid)
        if spans is None:
            return (t, math.inf)
        return next(((a, b) for a, b in spans if a <= t < b), None)

    def available_at(self, t: float, cids: Iterable[int]) -> list[int]:
        """Those of ``cids`` available at simulated time ``t`` (sorted)."""
        return sorted(p for p in cids if self.window_of(p, t) is not None)

    def wait_for(self, cids: Collection[int], need: int, server_round: int) -> list[int]:
        """Move ``now`` to the first time >= now at which ``need`` of ``cids`` are available
        (only a window's start can add one), or, if the windows never again hold that many,
        to the first time holding the most they will; the clients available then. No client
        ever again: ConfigError in one line (the run cannot go on)."""
        starts = self.starts_after_now(cids)
        best: tuple[int, float] = (-1, self.now)
        for t in (self.now, *starts):
            count = len(self.available_at(t, cids))
            if count >= need:
                best = (count, t)
                break
            if count > best[0]:
                best = (count, t)
        if best[0] <= 0:
            from fedinit.config.device_speeds import KEY

            raise ConfigError(f"run config: {KEY}: no client is available at or after "
                              f"sim-time {self.now:g} (round {server_round}): every window in "
                              f"the file has ended; allowed: windows that cover the run")
        if best[1] > self.now:
            log(INFO, "round %d: %d client(s) available at sim-time %g, %d needed: the clock "
                "waits until %g (%d available)", server_round,
                len(self.available_at(self.now, cids)), self.now, need, best[1], best[0])
        self.now = best[1]
        return self.available_at(self.now, cids)

    def leaves_at(self, cid: int, t: float) -> float | None:
        """When client ``cid``'s device goes away during a task started at ``t`` (the end of
        the window holding t), or None when the task finishes inside it (t + d_i < end)."""
        span = self.window_of(cid, t)
        end = t if span is None else span[1]
        return end if t + self.duration(cid) >= end else None

    def doomed(self, cid: int, finish: float) -> bool:
        """Whether a task of ``cid`` whose recorded finish is ``finish`` is a lost one (its
        finish is then its window's end, which no task that ends inside a window can be)."""
        return any(finish == b for _, b in (self.spans(cid) or ()))

    def lost(self, sent_to: Mapping[int, int]) -> dict[int, float]:
        """{node: seconds after ``now`` its device left} for this round's tasks (started at
        ``now``) that would not finish inside their client's window: lost."""
        out = {}
        for node, cid in sent_to.items():
            end = self.leaves_at(cid, self.now)
            if end is not None:
                out[node] = end - self.now
        return out

    def next_start(self, cids: Iterable[int]) -> float | None:
        """The first window start after ``now`` among ``cids`` (None: none opens again)."""
        starts = self.starts_after_now(cids)
        return starts[0] if starts else None

    def drop_lost(self, messages: Sequence[Message], lost: Mapping[int, float],
                  sent_to: Mapping[int, int], server_round: int) -> list[Message]:
        """``messages`` without those to the ``lost`` tasks' nodes (logged): never sent (the
        device goes away mid-task and saves nothing), counted missing as a dead node's."""
        if lost:
            log_line(self.private, INFO, "round %d: lost the tasks of client(s) %s: their "
                     "availability window closes before the task would end", server_round,
                     sorted(sent_to[n] for n in lost if n in sent_to))
        return [m for m in messages if m.metadata.dst_node_id not in lost]

    def duration(self, cid: int) -> float:
        """d_i: simulated seconds of one task of client ``cid``."""
        return float(self.task_seconds[cid])

    def sync_round(self, replies: Sequence[Message], sent_to: Mapping[int, int],
                   left: float = 0.0) -> float:
        """Advance by the slowest of the round's replies (none: 0), or by ``left`` (when its
        last lost device went away) if later; the round's seconds."""
        cids = [sent_to[m.metadata.src_node_id] for m in replies
                if m.metadata.src_node_id in sent_to]
        took = max(max((self.duration(p) for p in cids), default=0.0), left)
        self.now += took
        return took

    def order(self, replies: Sequence[Message], sent_to: Mapping[int, int]) -> list[Message]:
        """``replies`` in simulated finish order: (d_i, client id); ties never depend on
        arrival. A reply from a node not sent to this round is left out."""
        mine = [m for m in replies if m.metadata.src_node_id in sent_to]
        return sorted(mine, key=lambda m: (self.duration(sent_to[m.metadata.src_node_id]),
                                           sent_to[m.metadata.src_node_id]))

    def close_first(self, replies: Sequence[Message], need: int, sent_to: Mapping[int, int],
                    accepts: Callable[[Message], bool], server_round: int) -> Collected:
        """Over-selection on simulated order: keep replies in ``order`` until ``need`` are
        accepted; once closed, every other message sent (replied or not) is late, as
        ``collect_first`` counts them."""
        kept: list[Message] = []
        accepted = 0
        ordered = self.order(replies, sent_to)
        for msg in ordered:
            if accepted >= need:
                break
            kept.append(msg)
            accepted += accepts(msg)
        late = len(sent_to) - len(kept) if accepted >= need else 0
        if late:
            log(INFO, "round %d: closed at %d accepted replies in simulated order; %d later "
                "clients not waited for", server_round, accepted, late)
        return Collected(kept, accepted, late)
