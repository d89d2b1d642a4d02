"""Central DP under ``rounds=async`` (FedBuff): each flush of K buffered replies is one release.

Why each piece (docs/algorithms.md, "Asynchronous rounds", DP):
- Clip BEFORE the staleness weight: each buffered Delta_i is clipped to ``dp-clip`` C when it
  is buffered, then weighted by s(tau_i) <= 1 at the flush, so one client moves the weighted
  sum by at most C (exactly C at tau = 0, where every s is 1) and the noise z C is calibrated
  to that. Weighting first and clipping after would let a stale reply count in full.
- One noise draw per channel on the flush's SUM: D = (sum_i s(tau_i) clip(Delta_i) + N(0,
  (z C)^2)) / K, K = ``buffer-size`` fixed (the sync path's shares of 1/k of the variance on
  each reply would be scaled by s(tau_i) and the sum would carry less than the full noise).
  Each extra upload (SCAFFOLD's Delta_c_i, summed unweighted) is clipped to its own bound and
  its sum gets N(0, (z bound)^2); the method's rule reads those sums (``upload_sums``).
  Noise order: the model channel's arrays, then each extra upload in ``up_keys`` order, from
  ``rng`` (None: fresh OS entropy per flush; tests pass a seeded one).
- At most one reply per client per flush: a client with a reply in the current buffer
  (accepted or rejected) is not sent a task until the flush (``members``), so the
  sensitivity above holds with one contribution per client.
- A rejected reply (a failed check, a client's own error reply) fills its slot as a zero
  contribution: whether a flush is released never depends on a client's data.
- Accounting: T flushes are T Gaussian releases, no amplification (``Budget.for_flushes``),
  counted in the ledger (``server_app.privacy.Ledger``) before the flush's model exists, so
  before its row, evaluation, checkpoint or any task carrying it; ``dp-target-epsilon``
  stops the loop before a flush that would pass it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedinit.config import RunConfig
from fedinit.methods.dp import Mechanism, add, clip, gaussian_like
from fedinit.methods.dp_budget import Budget
from fedinit.methods.method import ClientUpdate
from fedinit.methods.weights import Weights
from server_app.privacy import Ledger, budget_spent
from server_app.run_basics import dp_fields
from strategies.round_stages.privacy import zero_contribution

ASYNC_DP_CONVENTIONS = {
    "dp-epsilon": "replace-one (one client's data replaced, N public); each flush one Gaussian "
                  "release per channel with no amplification by sampling (q = 1): the bound "
                  "of a client in every flush",
    "dp-epsilon-add-remove": "add-or-remove-one (one client added or removed); each flush one "
                             "Gaussian release per channel, no amplification (q = 1)",
}
"""summary.json's ``dp-epsilon-conventions`` under ``rounds=async``."""
DP_ASYNC_LEFT_OUT = ("buffered",)
"""Async row fields left out under DP (beside ``DP_LEFT_OUT``): it names each buffered
client."""


@dataclasses.dataclass
class FlushPrivacy:
    """The DP of one async run: clipping at buffering, noise at the flush, the ledger."""

    mechanism: Mechanism
    up_keys: tuple[str, ...]
    buffer_size: int
    budget: Budget
    ledger: Ledger
    cfg: RunConfig
    out: Path
    rng: np.random.Generator | None = None
    """The noise's generator; None: fresh OS entropy per flush (the run's seed is public)."""
    members: set[int] = dataclasses.field(default_factory=set)
    """Clients with a reply (accepted or rejected) in the current buffer: sent no task
    until the flush."""

    @classmethod
    def for_run(cls, cfg: RunConfig, up_keys: tuple[str, ...], out: Path, version: int,
                rows: Sequence[dict[str, Any]] | None) -> FlushPrivacy | None:
        """The run's DP (None when ``dp`` is off), its ledger continued from a checkpoint at
        ``version`` with ``rows`` (0 and None: a new run)."""
        if cfg.privacy.dp == "off":
            return None
        return cls(Mechanism.from_config(cfg), up_keys, cfg.async_buffer_size,
                   Budget.for_flushes(cfg, channels=1 + len(up_keys)),
                   Ledger.open(out, version, rows), cfg, out)

    def clipped(self, update: ClientUpdate) -> ClientUpdate:
        """The reply's Delta_i clipped to C and each extra upload to its bound (a no-op for
        an honest client, which clipped before sending)."""
        m = self.mechanism
        return dataclasses.replace(
            update, upload=clip(update.upload, m.clip),
            extras={k: clip(v, m.bound(k)) for k, v in update.extras.items()})

    def zero(self, w: Weights) -> ClientUpdate:
        """A rejected reply's slot: zeros in every channel (``zero_contribution``)."""
        return zero_contribution(w, self.up_keys)

    def noised(self, step: Weights, updates: Sequence[ClientUpdate],
               ) -> tuple[Weights, dict[str, Weights]]:
        """D = ``step`` + N(0, (z C)^2) / K (``step`` is sum_i s(tau_i) clip(Delta_i) / K,
        float64), and each extra upload's sum over ``updates`` + N(0, (z bound)^2)."""
        m, rng = self.mechanism, self.rng or np.random.default_rng()
        noise = gaussian_like(step, m.noise_multiplier * m.clip, rng)
        d = [s.astype(np.float64) + n / self.buffer_size for s, n in zip(step, noise, strict=True)]
        sums = {}
        for key in self.up_keys:
            total = [np.zeros(a.shape, dtype=np.float64) for a in step]
            for u in updates:
                for acc, a in zip(total, u.extras[key], strict=True):
                    acc += a.astype(np.float64)
            sums[key] = add(total, gaussian_like(total, m.noise_multiplier * m.bound(key), rng))
        return d, sums

    def spent(self, version: int) -> bool:
        """Whether the next flush (after ``version``) would take replace-one epsilon past
        ``dp-target-epsilon`` (logged); ConfigError when even the first would."""
        return budget_spent(self.budget, self.cfg, version + 1, self.ledger.counted + 1,
                            self.out)

    def count(self, version: int) -> None:
        """Count flush ``version`` durably, before it is computed; a new buffer begins."""
        self.ledger.count(version)
        self.members.clear()

    def fields(self) -> dict[str, Any]:
        """The flush row's epsilon under both conventions and the flushes counted."""
        return dp_fields(self.budget, self.ledger.counted)
