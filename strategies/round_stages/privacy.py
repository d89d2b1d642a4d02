"""Stage 7, client-level DP on the server (``fedinit.methods.dp.Mechanism.replies``): in the
pipeline
exactly when ``dp`` is on. With every arrived reply rejected the noise alone is released, on a
zero contribution that stands for no client (never counted as any client's round)."""

from __future__ import annotations

import dataclasses

import numpy as np

from fedinit.methods.dp import Mechanism
from fedinit.methods.method import ClientUpdate
from fedinit.methods.weights import Weights
from strategies.round_stages.replies import RoundReplies


@dataclasses.dataclass(frozen=True)
class ClientLevelDp:
    """``central``: each channel re-clipped and noised so that the sum over the replies is
    the clipped sum plus N(0, (z x bound)^2) per coordinate; ``local``: as received (the
    clients clipped and noised). ``rng`` None: fresh OS entropy every round."""

    mechanism: Mechanism
    up_keys: tuple[str, ...]
    rng: np.random.Generator | None = None

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        real = replies.contributions
        updates = real or [zero_contribution(replies.w_t, self.up_keys)]
        return dataclasses.replace(replies, real=bool(real),
                                   selected=tuple(self.mechanism.replies(updates, self.rng)))


def zero_contribution(w_t: Weights, up_keys: tuple[str, ...]) -> ClientUpdate:
    """A reply of zeros in every channel (model move and extra uploads, model-shaped): what
    a rejected reply adds to the sum under DP, carrying the round's noise when no reply was
    accepted."""
    zeros = [np.zeros_like(w) for w in w_t]
    return ClientUpdate(partition_id=-1, upload=zeros,
                        extras={k: [z.copy() for z in zeros] for k in up_keys},
                        num_examples=1, train_loss=0.0, num_steps=1)
