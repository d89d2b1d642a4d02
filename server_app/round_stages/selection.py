"""Stage 6, robust selection: the replies Krum, Multi-Krum or Bulyan let through
(``methods.robust.select``); in the pipeline only under those aggregations."""

from __future__ import annotations

import dataclasses
from logging import INFO, WARNING

from flwr.common.logger import log

from methods.method import ClientUpdate, RoundInput, ServerRule
from methods.robust import select
from methods.robust_choices import min_replies
from server_app.round_stages.replies import RoundReplies
from task.config import RunConfig


@dataclasses.dataclass(frozen=True)
class RobustSelection:
    """Judges each reply on its worst upload (the model move, each extra upload), each on its
    own scale (``methods.robust.select``); halts the round, logged, when too few replies came
    for ``byzantine-f``, as with too few replies for ``min-replies``."""

    cfg: RunConfig
    rule: ServerRule

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        chosen = self.choose(replies.server_round, replies.contributions, replies)
        if chosen is None:
            return dataclasses.replace(replies, halted=True)
        return dataclasses.replace(replies, selected=tuple(chosen))

    def choose(self, server_round: int, updates: list[ClientUpdate],
               replies: RoundReplies) -> list[ClientUpdate] | None:
        c = self.cfg
        moves = RoundInput(server_round=server_round, aggregate=[], updates=updates,
                           weights=[], variant=c.train.ri_aggregation, num_clients=c.num_clients,
                           lr=0.0, server_lr=0.0).moves(replies.w_t)
        joint = [[*m, *(a for k in self.rule.up_keys for a in u.extras[k])]
                 for m, u in zip(moves, updates, strict=True)]
        # each upload (the move, then each extra, all model-shaped) judged on its own scale
        chosen = select(joint, c.robust.aggregation, c.robust.byzantine_f,
                        channels=1 + len(self.rule.up_keys))
        if chosen is None:
            log(WARNING, "round %d: %d usable replies < %d that aggregation=%s needs with "
                "byzantine-f=%d; the global model is unchanged", server_round, len(updates),
                min_replies(c.robust.aggregation, c.robust.byzantine_f), c.robust.aggregation,
                c.robust.byzantine_f)
            return None
        dropped = [u.partition_id for i, u in enumerate(updates) if i not in chosen]
        log(INFO, "round %d: %s aggregates partitions %s, leaves out %s", server_round,
            c.robust.aggregation, [updates[i].partition_id for i in chosen], dropped)
        return [updates[i] for i in chosen]
