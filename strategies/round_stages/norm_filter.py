"""Stage 4, the norm filter: a reply with any uploaded vector above its norm limit is dropped
(logged); the accepted norms are the filter's history, which it owns and which is part of the
checkpointed server state, so a resumed run filters identically. Not in the pipeline under
DP (clipping bounds every reply: docs/algorithms.md, DP)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from fedinit.config import RunConfig
from fedinit.methods import wire as rk
from fedinit.methods.method import ClientUpdate
from fedinit.methods.norms import update_norms, vector_norm
from fedinit.methods.weights import Weights
from strategies.round_stages.held import HeldMethod
from strategies.round_stages.replies import RoundReplies, log_rejected

NORM_HISTORY = 64
"""Accepted upload norms kept per uploaded vector: the norm filter's reference in rounds with
few replies. Part of the server state (checkpointed), so a resumed run filters identically."""
MIN_ROUND_NORMS = 3
"""Fewest norms of this round alone that make a median reference without any history."""
FIRST_ROUND_FACTOR = 5.0
"""With no history and fewer than MIN_ROUND_NORMS replies, an upload may move the model by at
most this times ||w_t||. Honest round-1 moves measured 0.015-0.33 x ||w_0|| (all 100 clients,
full Fashion-MNIST, Dir-0.1, defaults; docs/faults.md): 15x headroom."""
NORMS_STATE = "norms:"
"""Server-state name prefix of a vector's norm history (``norms:<record name>``)."""


@dataclasses.dataclass
class NormFilter:
    """Drops replies whose upload norms are far above the recent accepted ones."""

    cfg: RunConfig
    method: HeldMethod
    history: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    """Record name -> its last NORM_HISTORY accepted norms."""

    def __call__(self, replies: RoundReplies) -> RoundReplies:
        """The kept replies, the dropped ones counted rejected, and the largest norm / limit
        seen (a round metric: how close honest replies come to the limit)."""
        good = replies.accepted
        if self.cfg.robust.max_update_norm_ratio == 0.0 or not good:
            return replies
        keys = (rk.ARRAYS, *self.method.rule.up_keys)
        updates = [u for _, u in good]
        norms = {key: self.upload_norms(key, updates, replies.w_t) for key in keys}
        limits = {key: self.limit(replies, key, norms[key]) for key in keys}
        keep, used, reasons = [], 0.0, []
        for i, (node, _) in enumerate(good):
            over = [f"{key!r} norm {norms[key][i]:.3g} > {limits[key][1]}" for key in keys
                    if norms[key][i] > limits[key][0]]
            used = max([used, *(norms[key][i] / limits[key][0] for key in keys)])
            if over:
                reasons.append((node, "; ".join(over)))
                log_rejected(replies, node, "; ".join(over))
            else:
                keep.append(i)
        for key in keys:
            self.remember(key, [norms[key][i] for i in keep])
        return dataclasses.replace(
            replies, accepted=tuple(good[i] for i in keep),
            rejected=replies.rejected + len(good) - len(keep), norm_limit_used=used,
            rejections=(*replies.rejections, *reasons))

    def upload_norms(self, key: str, updates: Sequence[ClientUpdate],
                     w_t: Weights) -> list[float]:
        """Norm of each reply's record ``key``: the move ||w_iK - w_t|| or ||Delta_i|| for
        the model upload, the plain norm for a method's extra upload (e.g. Delta_c_i)."""
        if key == rk.ARRAYS:
            return update_norms(w_t, [u.upload for u in updates], self.cfg.train.ri_aggregation)
        return update_norms(w_t, [u.extras[key] for u in updates], "update")

    def limit(self, replies: RoundReplies, key: str,
              round_norms: list[float]) -> tuple[float, str]:
        """The largest acceptable norm of ``key`` this round, and how it was set (for logs).

        Reference: the median of this round's norms and the recent accepted ones, so one
        reply cannot set its own bar. Without history and with fewer than MIN_ROUND_NORMS
        replies (round 1 of a small federation) the first-round bound applies.
        """
        history = self.history.get(key, [])
        ratio = self.cfg.robust.max_update_norm_ratio
        if history or len(round_norms) >= MIN_ROUND_NORMS:
            ref = float(np.median([*round_norms, *history]))
            limit = ratio * ref if ref > 0.0 else math.inf
            return limit, (f"max-update-norm-ratio {ratio:g} x median {ref:.3g} of "
                           f"{len(round_norms)} norms this round and {len(history)} accepted "
                           "before")
        limit = self.fallback_limit(key, replies.server_round, replies.w_t)
        return (limit if limit > 0.0 else math.inf), (
            f"{limit:.3g}, the first-round bound (no accepted norms yet)")

    def fallback_limit(self, key: str, server_round: int, w_t: Weights) -> float:
        """Bound without any reference norm: FIRST_ROUND_FACTOR x ||w_t|| for a move of the
        model; the method bounds its extra uploads from that (``extra_fallback_limit``)."""
        move = FIRST_ROUND_FACTOR * vector_norm(w_t)
        if key == rk.ARRAYS:
            return move
        return self.method.rule.extra_fallback_limit(key, self.method.state, move,
                                                     self.cfg.train.lr_at(server_round))

    def remember(self, key: str, norms: list[float]) -> None:
        """Append accepted norms to ``key``'s history, keeping the last NORM_HISTORY."""
        if norms:
            self.history[key] = [*self.history.get(key, []), *norms][-NORM_HISTORY:]

    # ------------------------------------------------------------ its part of the server state
    def arrays(self) -> dict[str, Weights]:
        """The history as named arrays (``norms:<record name>``) for a checkpoint."""
        return {NORMS_STATE + key: [np.asarray(norms, dtype=np.float64)]
                for key, norms in self.history.items()}

    def load(self, state: dict[str, Weights]) -> None:
        """Restore the history from a server state (its ``norms:`` entries)."""
        self.history = {n.removeprefix(NORMS_STATE): [float(x) for x in state[n][0]]
                        for n in sorted(owned(state))}


def owned(state: dict[str, Weights]) -> set[str]:
    """The server-state names that belong to the norm filter."""
    return {n for n in state if n.startswith(NORMS_STATE)}
