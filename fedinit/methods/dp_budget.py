"""The privacy accountant: epsilon at ``dp-delta`` after t rounds, from Google's
``dp-accounting`` RDP accountant (no privacy formula is written here), under two conventions.

What one round is, as the accountant sees it (docs/algorithms.md, section DP):
- The server's sampling: each round exactly m of ALL N registered clients without
  replacement, whoever is connected (``fedinit.methods.sampling.sample_registered``, drawn from a
  secret seed under DP; an absent client is a missing reply). The channels of a round (the
  model upload, SCAFFOLD's Delta_c_i) compose as one Gaussian (``ComposedDpEvent``).
- ``epsilon`` (``dp-epsilon``), REPLACE-ONE: neighbouring federations differ in ONE client's
  data, N public; replacing one client's clipped contribution moves a channel's sum by at most
  2 x its bound, so a channel noised with std z x bound is a Gaussian of multiplier z / 2.
  ``central``: ``SampledWithoutReplacementDpEvent(N, m, ...)``, exactly the server's sampling.
  Sampling never costs privacy, but the library's bound for it (Wang et al. 2019) exceeds the
  plain Gaussian's at small noise and large m / N, so the smaller of the two bounds is
  reported, each the library's. This is the figure ``dp-target-epsilon`` stops on.
- ``epsilon_add_remove`` (``dp-epsilon-add-remove``), ADD-OR-REMOVE-ONE, the convention
  papers report (Abadi et al. 2016, McMahan et al. 2018): a federation with or without one
  client; one client moves a channel's sum by at most its bound (multiplier z), and each
  client is in a round independently with probability q = m / N (``PoissonSampledDpEvent``).
  The server samples a fixed m, not Poisson: this figure is for comparison with papers and is
  a guarantee only for a Poisson-sampling server with the same q, not for this one.
- ``local``: each client's upload is itself the Gaussian mechanism; the server knows who was
  sampled, so there is no amplification by sampling: every round counts in full (a client
  that took part in every round, the worst case), under either convention (add/remove: the
  client's upload against a zero upload).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dp_accounting import DpEvent
    from dp_accounting.rdp import RdpAccountant

    from fedinit.methods.dp import DpSettings

REPLACE_SENSITIVITY = 2.0
"""A channel's L2 sensitivity in multiples of its clip bound under replace-one."""
ADD_REMOVE_SENSITIVITY = 1.0
"""A channel's L2 sensitivity in multiples of its clip bound under add-or-remove-one."""


def _channels(noise_multiplier: float, channels: int, sensitivity: float) -> DpEvent:
    import dp_accounting as dpa

    return dpa.ComposedDpEvent([dpa.GaussianDpEvent(noise_multiplier / sensitivity)
                                for _ in range(channels)])


def round_event(mode: str, noise_multiplier: float, channels: int, num_clients: int,
                per_round: int) -> DpEvent:
    """One round of the mechanism as a ``dp_accounting`` event, replace-one."""
    import dp_accounting as dpa

    gaussian = _channels(noise_multiplier, channels, REPLACE_SENSITIVITY)
    if mode == "local" or per_round >= num_clients:
        return gaussian
    return dpa.SampledWithoutReplacementDpEvent(source_dataset_size=num_clients,
                                                sample_size=per_round, event=gaussian)


def poisson_round_event(mode: str, noise_multiplier: float, channels: int, num_clients: int,
                        per_round: int) -> DpEvent:
    """One round as the add/remove convention models it: Poisson at q = m / N."""
    import dp_accounting as dpa

    gaussian = _channels(noise_multiplier, channels, ADD_REMOVE_SENSITIVITY)
    if mode == "local" or per_round >= num_clients:
        return gaussian
    return dpa.PoissonSampledDpEvent(sampling_probability=per_round / num_clients,
                                     event=gaussian)


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
    """The library logs a warning for every fractional RDP order whose series does not
    converge (it leaves that order out, which only loosens the bound): one per order and
    call, noise in a run's log."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class _Bound:
    """Epsilon after t rounds of one round event (as sampled, and unsampled: both bounds
    hold, the smaller is reported) under one neighbouring relation."""

    def __init__(self, events: list[DpEvent], new: Callable[[], RdpAccountant],
                 delta: float) -> None:
        self.events = [e for i, e in enumerate(events) if e not in events[:i]]
        self.delta = delta
        self._new = new
        self._accountants = [new() for _ in self.events]
        self._rounds = 0
        self._cache: dict[int, float] = {0: 0.0}

    def epsilon(self, rounds: int) -> float:
        if rounds not in self._cache:
            if rounds < self._rounds:  # asked backwards (a resume): recount from zero
                self._accountants = [self._new() for _ in self.events]
                self._rounds = 0
            with _quiet_absl():
                for accountant, event in zip(self._accountants, self.events, strict=True):
                    accountant.compose(event, rounds - self._rounds)
                self._rounds = rounds
                eps = min(float(a.get_epsilon(self.delta)) for a in self._accountants)
            self._cache[rounds] = eps if math.isfinite(eps) else math.inf
        return self._cache[rounds]


class Budget:
    """Epsilon after t rounds of one run's mechanism, under both conventions."""

    def __init__(self, mode: str, noise_multiplier: float, channels: int, num_clients: int,
                 per_round: int, delta: float) -> None:
        from dp_accounting import NeighboringRelation
        from dp_accounting.rdp import RdpAccountant

        args = (mode, noise_multiplier, channels, num_clients)
        self.event = round_event(*args, per_round)
        self.poisson_event = poisson_round_event(*args, per_round)
        self.delta = delta
        self._replace = _Bound(
            [self.event, round_event(*args, num_clients)],
            lambda: RdpAccountant(neighboring_relation=NeighboringRelation.REPLACE_ONE), delta)
        self._add_remove = _Bound(
            [self.poisson_event, poisson_round_event(*args, num_clients)],
            lambda: RdpAccountant(neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE),
            delta)

    @classmethod
    def for_run(cls, cfg: DpSettings, channels: int) -> Budget:
        """The budget of ``cfg``'s mechanism with ``channels`` uploaded vectors per reply."""
        p = cfg.privacy
        return cls(p.dp, p.dp_noise_multiplier, channels, cfg.num_clients,
                   cfg.clients_per_round, p.dp_delta)

    @classmethod
    def for_flushes(cls, cfg: DpSettings, channels: int) -> Budget:
        """The budget of ``rounds=async``: every flush a Gaussian release per channel, no
        sampling (q = 1: the sample of N out of N), whichever clients were in it."""
        p = cfg.privacy
        return cls(p.dp, p.dp_noise_multiplier, channels, cfg.num_clients,
                   cfg.num_clients, p.dp_delta)

    def epsilon(self, rounds: int) -> float:
        """Replace-one epsilon at ``delta`` after ``rounds`` rounds of fixed-size sampling
        (what the server does; inf when there is no noise)."""
        return self._replace.epsilon(rounds)

    def epsilon_add_remove(self, rounds: int) -> float:
        """Add-or-remove-one epsilon at ``delta`` after ``rounds`` Poisson-sampled rounds at
        q = m / N: the papers' convention, for comparison."""
        return self._add_remove.epsilon(rounds)
