"""Stage 5, the quorum: too few replies and the round is not aggregated (``min-replies``); too
many such rounds in a row and the run stops (``TooFewReplies``, ``max-failed-rounds``)."""

from __future__ import annotations

import dataclasses
from logging import WARNING

from strategies.operator_log import log_line
from strategies.round_stages.replies import RoundReplies


@dataclasses.dataclass(frozen=True)
class MinReplies:
    """Halts the round below ``min_replies``. ``count_arrived``: under DP whether a round is
    released may not depend on any client's data, so the replies that arrived count (a
    rejected one is a zero contribution); otherwise the usable ones."""

    min_replies: int
    count_arrived: bool = False

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        usable, what = ((replies.arrived, "arrived") if self.count_arrived
                        else (len(replies.accepted), "usable"))
        if usable >= self.min_replies:
            return replies
        # under DP how many replies arrived is the sample's secret: the operator's file
        log_line(self.count_arrived, WARNING,
                 "round %d: %d %s replies < min-replies=%d; the global model is "
                 "unchanged", replies.server_round, usable, what, self.min_replies)
        return dataclasses.replace(replies, halted=True)


class TooFewReplies(RuntimeError):
    """Rounds keep failing for lack of replies; the last checkpoint is there to resume."""
