"""Stage 9, the method's update: its pure ``ServerRule.update`` on the round's input, the
typed state replaced in the held method; then the round's accounting and metrics."""

from __future__ import annotations

import dataclasses

import numpy as np

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.method import RoundInput
from fedinit.methods.ri import divergence
from strategies.round_stages.combine import Mean
from strategies.round_stages.held import AccountedRounds, HeldMethod
from strategies.round_stages.replies import RoundReplies


@dataclasses.dataclass(frozen=True)
class MethodUpdate:
    """w_next, state = rule.update(state, w_t, RoundInput); ``combine`` is the run's rule,
    with which a method combines its extra uploads."""

    cfg: RunConfig
    method: HeldMethod
    combine: Mean

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        c = self.cfg
        if replies.aggregate is None:
            raise ValueError("the method update needs the round's aggregate: put a Combine "
                             "stage before it")
        # the moves are in D already; a screened reply's extra uploads are not summed
        counted = [(u, w) for u, w in zip(replies.contributions, replies.weights, strict=True)
                   if u.partition_id not in replies.unaccounted]
        rnd = RoundInput(server_round=replies.server_round, aggregate=replies.aggregate,
                         updates=[u for u, _ in counted], weights=[w for _, w in counted],
                         variant=c.train.ri_aggregation, num_clients=c.num_clients,
                         lr=c.train.lr_at(replies.server_round), server_lr=c.train.server_lr,
                         combine=self.combine, aggregation=c.robust.aggregation,
                         upload_sums=replies.sums)
        w_next, self.method.state = self.method.rule.update(self.method.state, replies.w_t,
                                                            rnd)
        return dataclasses.replace(replies, w_next=w_next)


@dataclasses.dataclass(frozen=True)
class AccountRound:
    """Each accounted client's round (an aggregated reply not screened), and the round's train
    loss (example-weighted; none under local DP, where devices report none) and divergence.
    Nothing for a round whose contribution stands for no client."""

    accounted: AccountedRounds
    train_loss: bool = True

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        if not replies.real or replies.w_next is None:
            return replies
        updates = replies.contributions
        self.accounted.count((u.partition_id for u in replies.accounted), replies.server_round)
        metrics = {
            **({rk.ROUND_TRAIN_LOSS: float(np.average(
                [u.train_loss for u in updates], weights=[u.num_examples for u in updates]))}
               if self.train_loss else {}),
            # under secure aggregation the server sees no final model: no divergence
            **({rk.DIVERGENCE: divergence(replies.finals, replies.w_next)}
               if replies.finals else {}),
        }
        return dataclasses.replace(replies, metrics=metrics)
