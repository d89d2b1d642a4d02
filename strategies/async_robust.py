"""Robust rules over FedBuff's buffer (``aggregation`` other than ``mean`` under
``rounds=async``): the rule judges and combines the K buffered raw deltas (each against the
version its task carried), then the result is scaled by the mean s(tau) of the replies it
kept.

Why raw deltas, then one scale: the rules judge replies by distance or rank, and scaling
each reply by its own s(tau) first would move a stale reply towards zero, so staleness would
decide who looks like an outlier (a stale honest reply closer to a zero-sized attack, a
median pulled towards zero). Scaling the rule's output by the mean s(tau) of what it kept
keeps FedBuff's damping of stale work; with ``staleness=constant`` a flush is the sync rule
over the buffer, unchanged. Krum, Multi-Krum and Bulyan need K = ``buffer-size`` above their
bound for ``byzantine-f`` (the run config refuses a smaller K in one line).
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import INFO

import numpy as np
from flwr.common.logger import log

from fedinit.methods.method import ClientUpdate
from fedinit.methods.robust import combine, select
from fedinit.methods.robust_choices import SELECTIONS
from fedinit.methods.weights import Weights


def robust_flush(updates: Sequence[ClientUpdate], factors: Sequence[float], kind: str,
                 trim: float, f: int, up_keys: Sequence[str], version: int,
                 ) -> tuple[Weights, list[int]]:
    """D = mean s(tau) over the kept replies x the rule over their deltas (``upload``, each
    a Delta_i), and the indices kept (all but under Krum, Multi-Krum, Bulyan)."""
    kept = list(range(len(updates)))
    if kind in SELECTIONS:
        joint = [[*u.upload, *(a for k in up_keys for a in u.extras[k])] for u in updates]
        chosen = select(joint, kind, f, channels=1 + len(up_keys))
        if chosen is None:  # the run config holds K above the bound
            raise ValueError(f"aggregation={kind!r} with byzantine-f={f} cannot run on "
                             f"{len(updates)} buffered replies")
        kept = chosen
        log(INFO, "version %d: %s aggregates clients %s, leaves out %s", version + 1, kind,
            [updates[i].partition_id for i in kept],
            [u.partition_id for i, u in enumerate(updates) if i not in kept])
    scale = float(np.mean([factors[i] for i in kept]))
    out = combine([updates[i].upload for i in kept], [1.0] * len(kept), kind, trim, f)
    return [scale * a.astype(np.float64) for a in out], kept
