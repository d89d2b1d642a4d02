"""The virtual clock of ``device-speeds``: simulated time, independent of the machine's load.

Each client's task takes its simulated duration d_i (``task.device_speeds``). A sync round
waits for its slowest reply: the clock advances by max d_i over the replies the round took.
With over-selection the round closes on simulated order, not arrival order: all replies are
collected, sorted by (d_i, client id), and the first m the decode checks accept are kept; the
round took d of the last one kept. ``rounds=async`` keeps its own times on the same durations
(``server_app/async_rounds.py``: each dispatch finishes at its send time + d_i). Every row
then carries ``sim-time``, the cumulative simulated seconds, beside the wall time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from logging import INFO

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from server_app.over_select import Collected
from task.config import RunConfig
from task.device_speeds import durations, slowdowns
from task.federated_data import partition_sizes

CLOCK_FIELDS = ("sim-time",)
"""The column a run with ``device-speeds`` on adds to each rounds.jsonl row: cumulative
simulated seconds at the row's end (a sync round's close, an async flush)."""


class VirtualClock:
    """Simulated time ``now`` and each client's task duration."""

    def __init__(self, task_seconds: Sequence[float] | np.ndarray, now: float = 0.0) -> None:
        self.task_seconds = np.asarray(task_seconds, dtype=np.float64)
        self.now = float(now)

    @classmethod
    def for_run(cls, cfg: RunConfig, now: float = 0.0) -> VirtualClock | None:
        """The run's clock (None under ``device-speeds=off``), starting at ``now`` (a
        resumed run's last ``sim-time``)."""
        slow = slowdowns(cfg.device_speeds, cfg.num_clients, cfg.seed)
        if slow is None:
            return None
        return cls(durations(slow, partition_sizes(cfg), cfg.local_epochs, cfg.batch_size), now)

    def duration(self, pid: int) -> float:
        """d_i: simulated seconds of one task of client ``pid``."""
        return float(self.task_seconds[pid])

    def sync_round(self, replies: Sequence[Message], sent_to: Mapping[int, int]) -> float:
        """Advance by the slowest of the round's replies (none: 0); the round's seconds."""
        pids = [sent_to[m.metadata.src_node_id] for m in replies
                if m.metadata.src_node_id in sent_to]
        took = max((self.duration(p) for p in pids), default=0.0)
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
