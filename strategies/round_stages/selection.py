"""Stage 6, robust selection: the replies Krum, Multi-Krum or Bulyan let through
(``fedinit.methods.robust.select``); in the pipeline only under those aggregations."""

from __future__ import annotations

import dataclasses
from logging import INFO, WARNING

from flwr.common.logger import log

from fedinit.config import RunConfig
from fedinit.methods.method import ClientUpdate, RoundInput, ServerRule
from fedinit.methods.robust import SCREEN, select, unaccounted
from fedinit.methods.robust_choices import min_replies
from strategies.round_stages.replies import RoundReplies


@dataclasses.dataclass(frozen=True)
class RobustSelection:
    """Selects on the model move alone (``fedinit.methods.robust.select``) and screens the selected
    replies' extra uploads (``unaccounted``: their moves count, their Delta_c_i and state do
    not); halts the round, logged, when too few replies came for ``byzantine-f``, as with
    too few replies for ``min-replies``."""

    cfg: RunConfig
    rule: ServerRule

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        got = self.choose(replies.server_round, replies.contributions, replies)
        if got is None:
            return dataclasses.replace(replies, halted=True)
        chosen, screened = got
        return dataclasses.replace(replies, selected=tuple(chosen),
                                   unaccounted=frozenset(u.partition_id for u in screened))

    def choose(self, server_round: int, updates: list[ClientUpdate], replies: RoundReplies
               ) -> tuple[list[ClientUpdate], list[ClientUpdate]] | None:
        """(the selected updates, those of them screened), or None: too few replies."""
        c = self.cfg
        moves = RoundInput(server_round=server_round, aggregate=[], updates=updates,
                           weights=[], variant=c.train.ri_aggregation, num_clients=c.num_clients,
                           lr=0.0, server_lr=0.0).moves(replies.w_t)
        joint = [[*m, *(a for k in self.rule.up_keys for a in u.extras[k])]
                 for m, u in zip(moves, updates, strict=True)]
        # the move selects; each extra upload, on its own scale, can only be screened out
        channels = 1 + len(self.rule.up_keys)
        chosen = select(joint, c.robust.aggregation, c.robust.byzantine_f, channels=channels)
        if chosen is None:
            log(WARNING, "round %d: %d usable replies < %d that aggregation=%s needs with "
                "byzantine-f=%d; the global model is unchanged", server_round, len(updates),
                min_replies(c.robust.aggregation, c.robust.byzantine_f), c.robust.aggregation,
                c.robust.byzantine_f)
            return None
        dropped = [u.partition_id for i, u in enumerate(updates) if i not in chosen]
        log(INFO, "round %d: %s aggregates partitions %s, leaves out %s", server_round,
            c.robust.aggregation, [updates[i].partition_id for i in chosen], dropped)
        screened = unaccounted(joint, chosen, c.robust.aggregation, c.robust.byzantine_f,
                               channels=channels)
        if screened:
            log(WARNING, "round %d: the extra uploads of partitions %s are far from the "
                "others' (Krum score over %g x their median): their moves count, their %s "
                "and state do not", server_round, [updates[i].partition_id for i in screened],
                SCREEN, ", ".join(self.rule.up_keys))
        return [updates[i] for i in chosen], [updates[i] for i in screened]
